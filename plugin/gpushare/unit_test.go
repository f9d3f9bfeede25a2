package gpushare_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestParseUnit(t *testing.T) {
	tests := []struct {
		in   string
		want gpushare.Unit
		ok   bool
	}{
		{"GiB", gpushare.GiB, true},
		{"MiB", gpushare.MiB, true},
		{"1GiB", gpushare.GiB, true},
		{"1024MiB", gpushare.GiB, true},
		{"512MiB", 512, true},
		{"256MiB", 256, true},
		{"2MiB", 2, true},
		{"1MiB", gpushare.MiB, true},
		{"0256MiB", 256, true}, // leading zeros are still plain digits
		{"", 0, false},
		{"gib", 0, false},
		{"Gi", 0, false},
		{"Mi", 0, false},
		{" GiB", 0, false},
		{"GiB ", 0, false},
		{"2GiB", 0, false},
		{"0GiB", 0, false},
		{"0MiB", 0, false},
		{"3MiB", 0, false},
		{"384MiB", 0, false},
		{"2048MiB", 0, false},
		{"-1MiB", 0, false},
		{"+2MiB", 0, false},
		{"1_024MiB", 0, false},
		{"1.5MiB", 0, false},
		{"MiB1", 0, false},
		{"18446744073709551616MiB", 0, false},
		{"18446744073709551615MiB", 0, false},
	}
	for _, tt := range tests {
		got, err := gpushare.ParseUnit(tt.in)
		if tt.ok {
			if err != nil || got != tt.want {
				t.Errorf("ParseUnit(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			continue
		}
		if !errors.Is(err, gpushare.ErrInvalidUnit) {
			t.Errorf("ParseUnit(%q) error = %v; want ErrInvalidUnit", tt.in, err)
		}
		var ue *gpushare.UnitError
		if !errors.As(err, &ue) || ue.Value != tt.in {
			t.Errorf("ParseUnit(%q) error %v is not a *UnitError naming the value", tt.in, err)
		}
	}
}

func TestParseUnitErrorNamesAllowedForms(t *testing.T) {
	_, err := gpushare.ParseUnit("3MiB")
	for _, want := range []string{`"3MiB"`, "GiB", "MiB", "divides 1024"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestUnitStringRoundTrip(t *testing.T) {
	want := map[gpushare.Unit]string{gpushare.GiB: "GiB", gpushare.MiB: "MiB", 256: "256MiB", 512: "512MiB", 2: "2MiB"}
	for u, s := range want {
		if u.MiB() != uint64(u) {
			t.Errorf("Unit(%d).MiB() = %d", u, u.MiB())
		}
		if u.String() != s {
			t.Errorf("Unit(%d).String() = %q; want %q", u.MiB(), u.String(), s)
		}
	}
	// Every valid unit survives String → ParseUnit.
	for n := gpushare.Unit(1); n <= gpushare.GiB; n *= 2 {
		got, err := gpushare.ParseUnit(n.String())
		if err != nil || got != n {
			t.Errorf("ParseUnit(%q) = %v, %v; want %d", n.String(), got, err, n)
		}
	}
}

func TestUnitValid(t *testing.T) {
	for _, tt := range []struct {
		u    gpushare.Unit
		want bool
	}{{0, false}, {1, true}, {3, false}, {64, true}, {1024, true}, {2048, false}} {
		if got := tt.u.Valid(); got != tt.want {
			t.Errorf("Unit(%d).Valid() = %v; want %v", tt.u, got, tt.want)
		}
	}
}

func TestUnitsFromMiB(t *testing.T) {
	tests := []struct {
		name string
		unit gpushare.Unit
		mib  uint64
		want uint64
	}{
		{"16 GB card in GiB", gpushare.GiB, 16160, 15},
		{"H100 80GB in GiB", gpushare.GiB, 81559, 79},
		{"H100 80GB in MiB", gpushare.MiB, 81559, 81559},
		{"16 GB card in 256MiB", 256, 16160, 63},
		{"exactly one GiB", gpushare.GiB, 1024, 1},
		{"just under one GiB", gpushare.GiB, 1023, 0},
		{"zero", gpushare.GiB, 0, 0},
		{"invalid zero unit", 0, 16160, 0},
		{"max MiB", gpushare.GiB, math.MaxUint64, math.MaxUint64 / 1024},
	}
	for _, tt := range tests {
		if got := tt.unit.UnitsFromMiB(tt.mib); got != tt.want {
			t.Errorf("%s: UnitsFromMiB(%d) = %d; want %d", tt.name, tt.mib, got, tt.want)
		}
	}
}

func TestToMiB(t *testing.T) {
	tests := []struct {
		unit  gpushare.Unit
		units uint64
		want  uint64
	}{
		{gpushare.GiB, 15, 15360},
		{gpushare.MiB, 15, 15},
		{256, 4, 1024},
		{gpushare.GiB, 0, 0},
		{gpushare.GiB, math.MaxUint64, math.MaxUint64}, // saturates
	}
	for _, tt := range tests {
		if got := tt.unit.ToMiB(tt.units); got != tt.want {
			t.Errorf("Unit(%d).ToMiB(%d) = %d; want %d", tt.unit, tt.units, got, tt.want)
		}
	}
}

func TestUnitText(t *testing.T) {
	b, err := json.Marshal(struct{ U gpushare.Unit }{256})
	if err != nil || string(b) != `{"U":"256MiB"}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	var v struct{ U gpushare.Unit }
	if err := json.Unmarshal([]byte(`{"U":"GiB"}`), &v); err != nil || v.U != gpushare.GiB {
		t.Fatalf("Unmarshal = %v, %v", v.U, err)
	}
	if err := json.Unmarshal([]byte(`{"U":"3MiB"}`), &v); !errors.Is(err, gpushare.ErrInvalidUnit) {
		t.Fatalf("Unmarshal(3MiB) error = %v; want ErrInvalidUnit", err)
	}
	if _, err := gpushare.Unit(3).MarshalText(); !errors.Is(err, gpushare.ErrInvalidUnit) {
		t.Fatalf("MarshalText(3) error = %v; want ErrInvalidUnit", err)
	}
}

func FuzzParseUnit(f *testing.F) {
	for _, s := range []string{"GiB", "MiB", "1GiB", "256MiB", "1024MiB", "3MiB", "0MiB", "-1MiB", "", "GiBMiB", "99999999999999999999MiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := gpushare.ParseUnit(s)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidUnit) {
				t.Fatalf("ParseUnit(%q) error %v is not ErrInvalidUnit", s, err)
			}
			return
		}
		if !u.Valid() {
			t.Fatalf("ParseUnit(%q) = invalid unit %d", s, u)
		}
		again, err := gpushare.ParseUnit(u.String())
		if err != nil || again != u {
			t.Fatalf("round trip %q → %q → %v, %v", s, u.String(), again, err)
		}
		if got := u.UnitsFromMiB(u.ToMiB(15)); got != 15 {
			t.Fatalf("UnitsFromMiB(ToMiB(15)) = %d for %v", got, u)
		}
	})
}
