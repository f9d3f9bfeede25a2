package main

import (
	"github.com/go-logr/logr"
	"go.uber.org/zap"
)

// klogSink routes client-go's klog output into zap, so the plugin has one
// log stream in one format.
type klogSink struct {
	log *zap.Logger
}

// newKlogSink returns a logr.Logger writing to log.
func newKlogSink(log *zap.Logger) logr.Logger {
	return logr.New(&klogSink{log: log.WithOptions(zap.AddCallerSkip(2))})
}

// Init implements logr.LogSink.
func (s *klogSink) Init(logr.RuntimeInfo) {}

// Enabled implements logr.LogSink: klog's V(1) and above are debug.
func (s *klogSink) Enabled(level int) bool {
	if level > 0 {
		return s.log.Core().Enabled(zap.DebugLevel)
	}
	return s.log.Core().Enabled(zap.InfoLevel)
}

// Info implements logr.LogSink.
func (s *klogSink) Info(level int, msg string, kv ...any) {
	if level > 0 {
		s.log.Debug(msg, fields(kv)...)
		return
	}
	s.log.Info(msg, fields(kv)...)
}

// Error implements logr.LogSink.
func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.log.Error(msg, append(fields(kv), zap.Error(err))...)
}

// WithValues implements logr.LogSink.
func (s *klogSink) WithValues(kv ...any) logr.LogSink {
	return &klogSink{log: s.log.With(fields(kv)...)}
}

// WithName implements logr.LogSink.
func (s *klogSink) WithName(name string) logr.LogSink {
	return &klogSink{log: s.log.Named(name)}
}

// fields turns logr's alternating keys and values into zap fields.
func fields(kv []any) []zap.Field {
	out := make([]zap.Field, 0, len(kv)/2+1)
	for i := 0; i+1 < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			key = "key"
		}
		out = append(out, zap.Any(key, kv[i+1]))
	}
	if len(kv)%2 == 1 {
		out = append(out, zap.Any("extra", kv[len(kv)-1]))
	}
	return out
}
