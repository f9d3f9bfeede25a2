package gpushare_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestEventNote(t *testing.T) {
	if got := gpushare.EventNote("short"); got != "short" {
		t.Errorf("EventNote(short) = %q", got)
	}
	long := strings.Repeat("é", gpushare.EventNoteLimit) // 2 bytes a rune
	got := gpushare.EventNote(long)
	if len(got) > gpushare.EventNoteLimit || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Errorf("EventNote(long) = %d bytes, valid %v, %q at the end", len(got), utf8.ValidString(got), got[len(got)-5:])
	}
}
