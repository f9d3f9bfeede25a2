package mps

import "testing"

func TestWithType(t *testing.T) {
	tests := []struct{ in, want string }{
		{"system_u:object_r:var_run_t:s0", "system_u:object_r:container_file_t:s0"},
		{"system_u:object_r:tmp_t:s0:c1,c2\x00", "system_u:object_r:container_file_t:s0:c1,c2"},
		{"unconfined_u:object_r:user_tmp_t", "unconfined_u:object_r:container_file_t"},
	}
	for _, tt := range tests {
		if got, err := withType(tt.in, containerFileType); err != nil || got != tt.want {
			t.Errorf("withType(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "user:role", "user:role::s0"} {
		if got, err := withType(bad, containerFileType); err == nil {
			t.Errorf("withType(%q) = %q, want an error", bad, got)
		}
	}
}

func TestOneLine(t *testing.T) {
	if got, want := oneLine("  first\n\nsecond  \n"), "first | second"; got != want {
		t.Errorf("oneLine = %q, want %q", got, want)
	}
}
