package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

const config = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
users:
- name: u
  user:
    token: t
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestLoadAsksForProtobuf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, "tester")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.UserAgent != "tester" {
		t.Errorf("host %q, user agent %q", cfg.Host, cfg.UserAgent)
	}
	if cfg.ContentType != runtime.ContentTypeProtobuf || !strings.HasPrefix(cfg.AcceptContentTypes, runtime.ContentTypeProtobuf+",") ||
		!strings.Contains(cfg.AcceptContentTypes, runtime.ContentTypeJSON) {
		t.Errorf("content type %q, accept %q; want protobuf with a JSON fallback", cfg.ContentType, cfg.AcceptContentTypes)
	}
}

func TestLoadNamesTheBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing")
	_, err := Load(path, "tester")
	if err == nil || !strings.Contains(err.Error(), "API client configuration") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("error %v; want one naming the configuration and the file", err)
	}
}
