package logging

import (
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// klog's levels map onto zap's: V(0) is info, V(1) and above debug, errors keep their error.
func TestKlogSinkLevelsAndFields(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := KlogSink(zap.New(core)).WithValues("node", "n1")
	log.Info("synced", "pods", 3)
	log.V(2).Info("noisy detail")
	log.Error(errors.New("boom"), "watch failed")

	entries := logs.AllUntimed()
	if len(entries) != 2 {
		t.Fatalf("got %d entries, want the info and the error (debug is off): %v", len(entries), entries)
	}
	if e := entries[0]; e.Message != "synced" || e.ContextMap()["pods"] != int64(3) || e.ContextMap()["node"] != "n1" {
		t.Errorf("info entry = %q %v", e.Message, e.ContextMap())
	}
	if e := entries[1]; e.Level != zap.ErrorLevel || e.ContextMap()["error"] != "boom" {
		t.Errorf("error entry = %v %v", e.Level, e.ContextMap())
	}
}
