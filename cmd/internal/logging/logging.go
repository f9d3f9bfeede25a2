// Package logging builds the programs' zap logger and routes client-go's klog
// into it, so each program writes one structured log stream.
package logging

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// New returns a JSON production logger at level and makes klog (client-go,
// informers, leader election) write through it under the name "client-go".
// klog's logger is process-wide, which is why only mains call this.
func New(level zapcore.Level) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(level)
	log, err := cfg.Build()
	if err != nil {
		return nil, err
	}
	klog.SetLogger(KlogSink(log.Named("client-go")))
	return log, nil
}
