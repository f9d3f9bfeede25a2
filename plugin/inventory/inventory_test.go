package inventory_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

// h200MiB is an H200's memory as NVML reports it (141 GiB less reserved memory).
const h200MiB = 143771

func gpus(mibs ...uint64) []inventory.GPU {
	out := make([]inventory.GPU, len(mibs))
	for i, m := range mibs {
		out[i] = inventory.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Model: "test", MemoryMiB: m}
	}
	return out
}

func eight(mib uint64) []inventory.GPU {
	return gpus(mib, mib, mib, mib, mib, mib, mib, mib)
}

func TestNew(t *testing.T) {
	tests := []struct {
		name      string
		gpus      []inventory.GPU
		unit      gpushare.Unit
		wantUnits []uint64 // by index; nil when an error is expected
	}{
		{"GiB rounds down", gpus(16160, 81559), gpushare.GiB, []uint64{15, 79}},
		{"MiB", gpus(16160), gpushare.MiB, []uint64{16160}},
		{"256MiB", gpus(16160, 40960), 256, []uint64{63, 160}},
		{"mixed sizes keep their own size", gpus(81559, 81559, 40326, 40326), gpushare.GiB, []uint64{79, 79, 39, 39}},
		{"unsorted input is sorted", []inventory.GPU{{Index: 1, UUID: "b", MemoryMiB: 2048}, {Index: 0, UUID: "a", MemoryMiB: 1024}}, gpushare.GiB, []uint64{1, 2}},
		{"invalid unit", gpus(1024), 3, nil},
		{"zero unit", gpus(1024), 0, nil},
		{"GPU below one unit", gpus(1023), gpushare.GiB, nil},
		{"duplicate index", []inventory.GPU{{Index: 0, UUID: "a", MemoryMiB: 1024}, {Index: 0, UUID: "b", MemoryMiB: 1024}}, gpushare.GiB, nil},
		{"duplicate UUID", []inventory.GPU{{Index: 0, UUID: "a", MemoryMiB: 1024}, {Index: 1, UUID: "a", MemoryMiB: 1024}}, gpushare.GiB, nil},
		{"no UUID", []inventory.GPU{{Index: 0, MemoryMiB: 1024}}, gpushare.GiB, nil},
		{"negative index", []inventory.GPU{{Index: -1, UUID: "a", MemoryMiB: 1024}}, gpushare.GiB, nil},
		{"index too large", []inventory.GPU{{Index: 64, UUID: "a", MemoryMiB: 1024}}, gpushare.GiB, nil},
		{"too many units", gpus(2 << 20), gpushare.MiB, nil},
	}
	for _, tt := range tests {
		inv, err := inventory.New(tt.gpus, tt.unit)
		if tt.wantUnits == nil {
			if !errors.Is(err, inventory.ErrInvalidInventory) {
				t.Errorf("%s: New error = %v; want ErrInvalidInventory", tt.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: New error = %v", tt.name, err)
			continue
		}
		var got []uint64
		var total uint64
		for _, g := range inv.GPUs() {
			got = append(got, g.Units)
			total += g.Units
			if !g.Healthy {
				t.Errorf("%s: GPU %d starts unhealthy", tt.name, g.Index)
			}
		}
		if !reflect.DeepEqual(got, tt.wantUnits) || inv.TotalUnits() != total || inv.HealthyUnits() != total {
			t.Errorf("%s: units %v (total %d, healthy %d); want %v", tt.name, got, inv.TotalUnits(), inv.HealthyUnits(), tt.wantUnits)
		}
	}
}

func TestDevicesAndParseRoundTrip(t *testing.T) {
	inv, err := inventory.New(gpus(3*1024, 12*1024), gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	devs := inv.Devices()
	if len(devs) != 15 {
		t.Fatalf("%d devices; want 15", len(devs))
	}
	perGPU := map[int]int{}
	seen := map[string]bool{}
	for _, d := range devs {
		if seen[d.ID] {
			t.Errorf("device ID %s twice", d.ID)
		}
		seen[d.ID] = true
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s health %q", d.ID, d.Health)
		}
		g, j, err := inv.ParseDevice(d.ID)
		if err != nil || inventory.DeviceID(g, j) != d.ID {
			t.Errorf("ParseDevice(%s) = %d, %d, %v", d.ID, g, j, err)
		}
		perGPU[g]++
	}
	if perGPU[0] != 3 || perGPU[1] != 12 {
		t.Errorf("devices per GPU %v; want 3 and 12", perGPU)
	}
	if devs[3].ID != "1-0" || devs[14].ID != "1-11" {
		t.Errorf("IDs not compact and ordered: %s, %s", devs[3].ID, devs[14].ID)
	}
	for _, bad := range []string{"", "0", "0-", "-1", "2-0", "0-3", "1-12", "01-1", "1-01", "+1-1", "1-+1", "1--1", "0-1-2", "GPU-0-_-1", "a-b"} {
		if _, _, err := inv.ParseDevice(bad); !errors.Is(err, inventory.ErrUnknownDevice) {
			t.Errorf("ParseDevice(%q) error = %v; want ErrUnknownDevice", bad, err)
		}
	}
}

// MessageSize is computed without building the message; it must equal what
// protobuf encodes, including across digit-length boundaries and unhealthy GPUs.
func TestMessageSizeIsExact(t *testing.T) {
	for _, tt := range []struct {
		name string
		gpus []inventory.GPU
		unit gpushare.Unit
	}{
		{"GiB", gpus(16160, 81559), gpushare.GiB},
		{"single digit", gpus(9 * 1024), gpushare.GiB},
		{"boundary 10", gpus(10 * 1024), gpushare.GiB},
		{"boundary 100", gpus(100*1024, 1024), gpushare.GiB},
		{"MiB with index above 9", append(gpus(16160), inventory.GPU{Index: 12, UUID: "x", MemoryMiB: 12345}), gpushare.MiB},
		{"64MiB on 8 x H200", eight(h200MiB), 64},
	} {
		inv, err := inventory.New(tt.gpus, tt.unit)
		if err != nil {
			t.Fatal(err)
		}
		check := func(when string, inv *inventory.Inventory) {
			want := proto.Size(&pluginapi.ListAndWatchResponse{Devices: inv.Devices()})
			if got := inv.MessageSize(); got != want {
				t.Errorf("%s %s: MessageSize = %d; proto.Size = %d", tt.name, when, got, want)
			}
		}
		check("healthy", inv)
		sick, _, err := inv.SetUnhealthy(tt.gpus[0].Index, "Xid 79", inventory.Never, time.Unix(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		check("one unhealthy", sick)
	}
}

func TestCheckMessageSize(t *testing.T) {
	tests := []struct {
		name        string
		gpus        []inventory.GPU
		unit        gpushare.Unit
		limit       int
		wantSuggest gpushare.Unit // 0 with wantOK false: refused, nothing fits
		wantOK      bool
	}{
		{"8 x H200 GiB fits", eight(h200MiB), gpushare.GiB, inventory.KubeletMaxMessageSize, 0, true},
		{"8 x H200 256MiB fits", eight(h200MiB), 256, inventory.KubeletMaxMessageSize, 0, true},
		{"8 x H200 64MiB fits", eight(h200MiB), 64, inventory.KubeletMaxMessageSize, 0, true},
		{"8 x H200 MiB is refused, 8MiB named", eight(h200MiB), gpushare.MiB, inventory.KubeletMaxMessageSize, 8, false},
		{"one 16 GiB card in MiB fits", gpus(16160), gpushare.MiB, inventory.KubeletMaxMessageSize, 0, true},
		{"nothing fits a tiny limit", gpus(16160), gpushare.MiB, 10, 0, false},
	}
	for _, tt := range tests {
		inv, err := inventory.New(tt.gpus, tt.unit)
		if err != nil {
			t.Fatal(err)
		}
		err = inv.CheckMessageSize(tt.limit)
		if tt.wantOK {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		var te *inventory.MessageTooLargeError
		if !errors.Is(err, inventory.ErrMessageTooLarge) || !errors.As(err, &te) {
			t.Errorf("%s: error = %v; want *MessageTooLargeError", tt.name, err)
			continue
		}
		if te.Suggest != tt.wantSuggest || te.Size <= tt.limit || te.Unit != tt.unit {
			t.Errorf("%s: %+v; want suggestion %v", tt.name, te, tt.wantSuggest)
		}
		if te.Suggest != 0 {
			// The suggestion must itself pass, and the unit just below it must not.
			ok, err := inventory.New(tt.gpus, te.Suggest)
			if err != nil || ok.CheckMessageSize(tt.limit) != nil {
				t.Errorf("%s: suggested unit %v does not pass", tt.name, te.Suggest)
			}
			if below := te.Suggest / 2; below > tt.unit {
				inv, _ := inventory.New(tt.gpus, below)
				if inv.CheckMessageSize(tt.limit) == nil {
					t.Errorf("%s: %v also fits; the suggestion is not the smallest", tt.name, below)
				}
			}
		}
		t.Logf("%s: %v", tt.name, err)
	}
}

func TestNewWithoutGPUs(t *testing.T) {
	// Every GPU of the node skipped (MIG): an empty inventory that advertises nothing.
	inv, err := inventory.New(nil, gpushare.GiB)
	if err != nil {
		t.Fatalf("New(no GPUs) = %v", err)
	}
	if len(inv.GPUs()) != 0 || len(inv.Devices()) != 0 || inv.TotalUnits() != 0 {
		t.Errorf("empty inventory has %d GPUs, %d devices", len(inv.GPUs()), len(inv.Devices()))
	}
	if enc, err := gpushare.EncodeNodeGPUs(inv.NodeGPUs(false)); err != nil || enc != `{"unit":"GiB","simulated":false,"gpus":[]}` {
		t.Errorf("NodeGPUs of an empty inventory = %s, %v", enc, err)
	}
	if err := inv.CheckMessageSize(inventory.KubeletMaxMessageSize); err != nil {
		t.Errorf("CheckMessageSize of an empty inventory = %v", err)
	}
}

func TestHealth(t *testing.T) {
	base, err := inventory.New(gpus(2048, 2048, 4096), gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	quiet := time.Minute
	sick, changed, err := base.SetUnhealthy(1, "Xid 62", inventory.AfterQuiet, t0)
	if err != nil || !changed {
		t.Fatalf("SetUnhealthy = %v, %v", changed, err)
	}
	if g, _ := base.GPU(1); !g.Healthy {
		t.Error("SetUnhealthy changed the original inventory")
	}
	if sick.HealthyUnits() != 6 || sick.TotalUnits() != 8 {
		t.Errorf("healthy %d total %d; want 6 and 8", sick.HealthyUnits(), sick.TotalUnits())
	}
	var unhealthy []string
	for _, d := range sick.Devices() {
		if d.Health == pluginapi.Unhealthy {
			unhealthy = append(unhealthy, d.ID)
		}
	}
	if !reflect.DeepEqual(unhealthy, []string{"1-0", "1-1"}) {
		t.Errorf("unhealthy devices %v; want GPU 1's", unhealthy)
	}
	desc := sick.NodeGPUs(true)
	if !desc.Simulated || desc.GPUs[1].Healthy || desc.GPUs[1].Reason != "Xid 62" || desc.GPUs[1].Permanent || !desc.GPUs[0].Healthy || desc.Unit != gpushare.GiB {
		t.Errorf("NodeGPUs = %+v", desc)
	}
	if _, err := gpushare.EncodeNodeGPUs(desc); err != nil {
		t.Errorf("NodeGPUs does not encode: %v", err)
	}
	// A second event later restarts the quiet period.
	again, changed, err := sick.SetUnhealthy(1, "Xid 62", inventory.AfterQuiet, t0.Add(30*time.Second))
	if err != nil || changed {
		t.Errorf("repeated SetUnhealthy: changed %v, %v; want unchanged", changed, err)
	}
	if at, ok := again.NextRecovery(quiet); !ok || !at.Equal(t0.Add(90*time.Second)) {
		t.Errorf("NextRecovery = %v, %v; want t0+90s", at, ok)
	}
	if same, rec := again.Recover(t0.Add(89*time.Second), quiet); rec != nil || same != again {
		t.Errorf("Recover before the quiet period = %v", rec)
	}
	healed, rec := again.Recover(t0.Add(90*time.Second), quiet)
	if !reflect.DeepEqual(rec, []int{1}) || healed.HealthyUnits() != 8 {
		t.Errorf("Recover after the quiet period = %v, healthy %d", rec, healed.HealthyUnits())
	}
	if g, _ := healed.GPU(1); g.Reason != "" {
		t.Errorf("recovered GPU keeps reason %q", g.Reason)
	}
	if _, ok := healed.NextRecovery(quiet); ok {
		t.Error("NextRecovery with all healthy reports a time")
	}
	if _, _, err := base.SetUnhealthy(7, "x", inventory.Never, t0); !errors.Is(err, inventory.ErrUnknownGPU) {
		t.Errorf("SetUnhealthy on a missing GPU = %v; want ErrUnknownGPU", err)
	}
	if _, _, err := base.Watched(7); !errors.Is(err, inventory.ErrUnknownGPU) {
		t.Errorf("SetUnhealthy on a missing GPU = %v; want ErrUnknownGPU", err)
	}
	if idx, ok := base.IndexOfUUID("GPU-2"); !ok || idx != 2 {
		t.Errorf("IndexOfUUID = %d, %v", idx, ok)
	}
	if _, ok := base.IndexOfUUID("GPU-9"); ok {
		t.Error("IndexOfUUID found a missing UUID")
	}
}

// step is one health change applied to GPU 0 of a one-GPU inventory.
type step struct {
	at      time.Duration // after t0
	fault   string        // SetUnhealthy with this reason; empty for Watched
	rec     inventory.Recovery
	changed bool // what the call must report
}

func TestHealthRecoveryPolicy(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const quiet = time.Minute
	tests := []struct {
		name  string
		steps []step
		// after the steps, checked at t0+check:
		check      time.Duration
		healthy    bool
		reason     string // the published reason
		permanent  bool
		nextDue    time.Duration // NextRecovery - t0; 0 means none due
		recovering bool          // Recover at check heals it
	}{
		{"transient heals after the quiet period", []step{{0, "Xid 62", inventory.AfterQuiet, true}},
			quiet, false, "Xid 62", false, quiet, true},
		{"fatal never heals", []step{{0, "Xid 79", inventory.Never, true}},
			100 * quiet, false, "Xid 79 (permanent: the GPU needs a reset or a repair, then a restart of the device plugin)", true, 0, false},
		{"a transient fault does not weaken a fatal one", []step{{0, "Xid 79", inventory.Never, true}, {time.Second, "Xid 62", inventory.AfterQuiet, false}},
			100 * quiet, false, "Xid 79 (permanent: the GPU needs a reset or a repair, then a restart of the device plugin)", true, 0, false},
		{"a fatal fault hardens a transient one", []step{{0, "Xid 62", inventory.AfterQuiet, true}, {time.Second, "Xid 48", inventory.Never, true}},
			100 * quiet, false, "Xid 48 (permanent: the GPU needs a reset or a repair, then a restart of the device plugin)", true, 0, false},
		{"unwatched does not heal with time", []step{{0, "health watch unavailable", inventory.WhenWatched, true}},
			100 * quiet, false, "health watch unavailable", false, 0, false},
		{"unwatched heals when watched", []step{{0, "health watch unavailable", inventory.WhenWatched, true}, {time.Second, "", 0, true}},
			time.Second, true, "", false, 0, false},
		{"watched does not heal a fatal fault", []step{{0, "Xid 95", inventory.Never, true}, {time.Second, "", 0, false}},
			time.Second, false, "Xid 95 (permanent: the GPU needs a reset or a repair, then a restart of the device plugin)", true, 0, false},
		{"watched does not heal a transient fault", []step{{0, "Xid 62", inventory.AfterQuiet, true}, {time.Second, "", 0, false}},
			time.Second, false, "Xid 62", false, quiet, false},
		{"watched on a healthy GPU changes nothing", []step{{0, "", 0, false}},
			0, true, "", false, 0, false},
		{"a fault while unwatched is kept once watched", []step{{0, "unwatched", inventory.WhenWatched, true}, {time.Second, "Xid 79", inventory.Never, true}, {2 * time.Second, "", 0, false}},
			time.Hour, false, "Xid 79 (permanent: the GPU needs a reset or a repair, then a restart of the device plugin)", true, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv, err := inventory.New(gpus(1024), gpushare.GiB)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				var changed bool
				if s.fault == "" {
					inv, changed, err = inv.Watched(0)
				} else {
					inv, changed, err = inv.SetUnhealthy(0, s.fault, s.rec, t0.Add(s.at))
				}
				if err != nil || changed != s.changed {
					t.Errorf("step %d: changed %v, %v; want %v", i, changed, err, s.changed)
				}
			}
			g := inv.NodeGPUs(false).GPUs[0]
			if g.Healthy != tt.healthy || g.Reason != tt.reason || g.Permanent != tt.permanent {
				t.Errorf("published %+v; want healthy %v, reason %q, permanent %v", g, tt.healthy, tt.reason, tt.permanent)
			}
			at, ok := inv.NextRecovery(quiet)
			if (tt.nextDue != 0) != ok || (ok && !at.Equal(t0.Add(tt.nextDue))) {
				t.Errorf("NextRecovery = %v, %v; want t0+%v", at, ok, tt.nextDue)
			}
			healed, rec := inv.Recover(t0.Add(tt.check), quiet)
			if (len(rec) == 1) != tt.recovering {
				t.Errorf("Recover at t0+%v = %v; want recovering %v", tt.check, rec, tt.recovering)
			}
			if g, _ := healed.GPU(0); tt.recovering && (!g.Healthy || g.Reason != "") {
				t.Errorf("recovered GPU = %+v", g)
			}
		})
	}
}
