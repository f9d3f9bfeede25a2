// Package server is the extender's HTTP glue: bounded bodies, decoding,
// calling the cache, allocator and binder, encoding; plus /version,
// /healthz, /readyz (503 until the cache has synced) and /metrics. It holds
// no scheduling logic of its own.
package server
