package logging

import (
	"fmt"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// KlogSink returns a logr.Logger writing to log: V(0) at info, higher V at debug.
func KlogSink(log *zap.Logger) logr.Logger {
	return logr.New(&sink{log: log.WithOptions(zap.AddCallerSkip(1))})
}

type sink struct {
	log *zap.Logger
}

// Init implements logr.LogSink.
func (s *sink) Init(logr.RuntimeInfo) {}

func level(v int) zapcore.Level {
	if v > 0 {
		return zapcore.DebugLevel
	}
	return zapcore.InfoLevel
}

// Enabled implements logr.LogSink.
func (s *sink) Enabled(v int) bool { return s.log.Core().Enabled(level(v)) }

// Info implements logr.LogSink.
func (s *sink) Info(v int, msg string, kv ...any) {
	if ce := s.log.Check(level(v), msg); ce != nil {
		ce.Write(fields(kv)...)
	}
}

// Error implements logr.LogSink.
func (s *sink) Error(err error, msg string, kv ...any) {
	s.log.Error(msg, append(fields(kv), zap.Error(err))...)
}

// WithValues implements logr.LogSink.
func (s *sink) WithValues(kv ...any) logr.LogSink { return &sink{log: s.log.With(fields(kv)...)} }

// WithName implements logr.LogSink.
func (s *sink) WithName(name string) logr.LogSink { return &sink{log: s.log.Named(name)} }

// fields turns logr's key/value pairs into zap fields; a dangling key or a
// non-string key is kept rather than dropped, so no log line loses data.
func fields(kv []any) []zap.Field {
	out := make([]zap.Field, 0, (len(kv)+1)/2)
	for i := 0; i < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			key = fmt.Sprint(kv[i])
		}
		if i+1 >= len(kv) {
			out = append(out, zap.Any(key, "(missing value)"))
			break
		}
		out = append(out, zap.Any(key, kv[i+1]))
	}
	return out
}
