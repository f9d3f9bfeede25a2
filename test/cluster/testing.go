package cluster

import (
	"context"
	"testing"
)

// StartT starts a cluster for a test and stops it when the test ends. When the test failed, the
// tail of every component's log is printed first.
func StartT(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	c, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("component logs:\n%s", c.Logs(60))
		}
		c.Stop()
	})
	return c
}
