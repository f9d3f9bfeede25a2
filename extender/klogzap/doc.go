// Package klogzap routes client-go's klog output into a *zap.Logger through a
// logr.LogSink, so the extender writes one structured log stream.
package klogzap
