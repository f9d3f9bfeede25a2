package app

import (
	"net/http"
	"net/http/pprof"
)

// debugHandler serves net/http/pprof on its own mux, for the separate debug
// listener only: profiles reveal internals and cost CPU, so the public port
// (reachable by anything that reaches the scheduler's extender URL) never
// serves them.
func debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
