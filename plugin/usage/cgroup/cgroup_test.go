package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testdataOwners names the expected result of every file under testdata/; a
// file that is missing from the table fails TestParseTestdata.
var testdataOwners = map[string]struct {
	owner Owner
	ok    bool
}{
	"v2_systemd_containerd_burstable.txt":  {owner("f2552649-3880-4539-a3a3-3eed8c384b4a", "dd70e729e490462e3f09dd05d0e57a296a37baaa5441598191930968b07b0067", QoSBurstable), true},
	"v2_systemd_containerd_besteffort.txt": {owner("dc165952-f8bf-4263-83ab-a7f882d2f4fe", "a320058a7ee1f8c437ccdb70d985334c69e635697354a8bd2436b28b7100ddfd", QoSBestEffort), true},
	"v2_systemd_containerd_guaranteed.txt": {owner("16009e08-5caa-43f3-ae80-b4fa9b544f37", "e12d8d92c48d6318d09b3fd3366b052657cc260b10ca8c0f4c0a71d4a9c4aec6", QoSGuaranteed), true},
	"v2_systemd_crio.txt":                  {owner("d9acc3ec-c7fd-404b-a5ed-aec162328289", "e1616ee7bd237d5d62d600d40f97d20f589c55776202b12c58894b058e7aba3d", QoSBurstable), true},
	"v2_systemd_crio_conmon.txt":           {Owner{}, false},
	"v2_systemd_docker.txt":                {owner("2353e9eb-aec3-4ed8-aeff-267e420fa09f", "8d0f46f57ddac70567df7ad6b6f9326c6aa44e6494547cdcb58f23719cc7b4f9", QoSBestEffort), true},
	"v1_systemd_containerd.txt":            {owner("d0fe43b7-4086-4a43-b239-e76a7f0ce653", "30b46d22432f86aa8a8c19e7d625a71c3ea15a82c5ffe94eff10d46dd3486b2f", QoSBurstable), true},
	"v1_cgroupfs_burstable.txt":            {owner("a51cac8d-92f4-4328-bf23-4c03d24c8c1e", "3a85410ae32bfae3228c5ebaa42415bf3ba507eae3b5a3777343520c90395ea5", QoSBurstable), true},
	"v1_cgroupfs_besteffort.txt":           {owner("399c568c-9f92-4da2-a93b-adafd9acb10f", "03efa306999acc39a8c48eb2e8ca56c4ff6a59feac5132694dc52e6444fa005c", QoSBestEffort), true},
	"v2_cgroupfs_guaranteed.txt":           {owner("7fb9008b-9738-4f83-817f-04af44cf012f", "baf4d6de3a23a95aa94487ba35006132b661d9e5512b157dd433aa2ea6fc193b", QoSGuaranteed), true},
	"v2_cgroupfs_crio.txt":                 {owner("d5ce158c-d81e-495a-8d79-7675cc4df9b3", "a9ace7b39d8dd280b063f2bd31fc1fe58de711aca6d2ff17c117e72cbd9873c8", QoSBurstable), true},
	"v1_dind_kind_cgroupfs.txt":            {owner("57af7cbd-e187-4272-974f-a1fe2529cd9a", "62473b8544525fa68de295aaa88047c7251d9ea3be4d3ed8b458d57a7f2c816d", QoSBestEffort), true},
	"v2_kind_kubelet_slice.txt":            {owner("7fc2335d-de59-4862-9332-ffc4947df4b2", "e322b340845fb119b1659caf2968fbf00d7e422745a85b96dcf442eb7afaa918", QoSBurstable), true},
	"v2_containerd_colon_form.txt":         {owner("f2552649-3880-4539-a3a3-3eed8c384b4a", "a320058a7ee1f8c437ccdb70d985334c69e635697354a8bd2436b28b7100ddfd", QoSBurstable), true},
	"v2_cgroupns_relative_systemd.txt":     {owner("dc165952-f8bf-4263-83ab-a7f882d2f4fe", "e12d8d92c48d6318d09b3fd3366b052657cc260b10ca8c0f4c0a71d4a9c4aec6", QoSBestEffort), true},
	"v2_cgroupns_relative_cgroupfs.txt":    {owner("16009e08-5caa-43f3-ae80-b4fa9b544f37", "e1616ee7bd237d5d62d600d40f97d20f589c55776202b12c58894b058e7aba3d", ""), true},
	"v2_cgroupns_relative_host.txt":        {Owner{}, false},
	"v2_cgroupns_root.txt":                 {Owner{}, false},
	"v1_pod_cgroup_no_container.txt":       {Owner{}, false},
	"v2_subcgroup_init.txt":                {owner("2353e9eb-aec3-4ed8-aeff-267e420fa09f", "8d0f46f57ddac70567df7ad6b6f9326c6aa44e6494547cdcb58f23719cc7b4f9", QoSBurstable), true},
	"v2_nested_child_cgroupfs.txt":         {owner("d0fe43b7-4086-4a43-b239-e76a7f0ce653", "30b46d22432f86aa8a8c19e7d625a71c3ea15a82c5ffe94eff10d46dd3486b2f", QoSBurstable), true},
	"v2_nested_spoof.txt":                  {owner("a51cac8d-92f4-4328-bf23-4c03d24c8c1e", "3a85410ae32bfae3228c5ebaa42415bf3ba507eae3b5a3777343520c90395ea5", QoSBestEffort), true},
	"v1_disagree_memory_wins.txt":          {owner("d5ce158c-d81e-495a-8d79-7675cc4df9b3", "a9ace7b39d8dd280b063f2bd31fc1fe58de711aca6d2ff17c117e72cbd9873c8", QoSBurstable), true},
	"v1_no_memory_pod_first_wins.txt":      {owner("57af7cbd-e187-4272-974f-a1fe2529cd9a", "62473b8544525fa68de295aaa88047c7251d9ea3be4d3ed8b458d57a7f2c816d", QoSBurstable), true},
	"v2_host_persistenced.txt":             {Owner{}, false},
	"v2_host_user.txt":                     {Owner{}, false},
	"v2_host_init.txt":                     {Owner{}, false},
	"v2_host_docker_container.txt":         {Owner{}, false},
	"v1_host_service.txt":                  {Owner{}, false},
}

func owner(uid, id, qos string) Owner { return Owner{PodUID: uid, ContainerID: id, QoS: qos} }

func TestParseTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	seen := map[string]bool{}
	for _, file := range files {
		name := filepath.Base(file)
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			want, listed := testdataOwners[name]
			if !listed {
				t.Fatalf("%s has no expected owner in testdataOwners", name)
			}
			content, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got, ok, err := Parse(content)
			if err != nil || ok != want.ok || got != want.owner {
				t.Errorf("Parse = %+v, %v, %v; want %+v, %v, nil", got, ok, err, want.owner, want.ok)
			}
		})
	}
	for name := range testdataOwners {
		if !seen[name] {
			t.Errorf("testdataOwners names %s, which is not under testdata/", name)
		}
	}
}

const (
	uid  = "f2552649-3880-4539-a3a3-3eed8c384b4a"
	uidU = "f2552649_3880_4539_a3a3_3eed8c384b4a"
	cid  = "dd70e729e490462e3f09dd05d0e57a296a37baaa5441598191930968b07b0067"
)

func TestParseInline(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          Owner
		ok            bool
	}{
		{"no trailing newline", "0::/kubepods/pod" + uid + "/" + cid, owner(uid, cid, QoSGuaranteed), true},
		{"upper case normalised", "0::/kubepods/pod" + strings.ToUpper(uid) + "/" + strings.ToUpper(cid) + "\n", owner(uid, cid, QoSGuaranteed), true},
		{"qos cgroup", "0::/kubepods.slice/kubepods-burstable.slice\n", Owner{}, false},
		{"kubepods root", "0::/kubepods\n", Owner{}, false},
		{"pod slice only", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice\n", Owner{}, false},
		{"unknown child of pod", "0::/kubepods/pod" + uid + "/not-a-container\n", Owner{}, false},
		{"unknown runtime", "0::/kubepods/pod" + uid + "/kata-" + cid + "\n", Owner{}, false},
		{"unknown inline runtime", "0::/kubepods-pod" + uidU + ".slice:kata:" + cid + "\n", Owner{}, false},
		{"cgroupfs conmon", "0::/kubepods/burstable/pod" + uid + "/crio-conmon-" + cid + "\n", Owner{}, false},
		{"relative only dots", "0::/../..\n", Owner{}, false},
		{"relative podman is no pod", "0::/../../user.slice/podman-1234.scope\n", Owner{}, false},
		{"relative pod-like is no pod", "0::/../podman-1234.scope\n", Owner{}, false},
		{"relative qos", "0::/../../besteffort/pod" + uid + "/" + cid + "\n", owner(uid, cid, QoSBestEffort), true},
		{"not kubepods", "0::/machine.slice/machine-pod" + uidU + ".slice/crio-" + cid + ".scope\n", Owner{}, false},
		{"pod dir outside kubepods", "0::/podsomething/" + cid + "\n", Owner{}, false},
		{"ignored v1 hierarchy", "5:devices:/kubepods/pod" + uid + "/" + cid + "\n4:memory:/\n", Owner{}, false},
		{"memory pod without container wins", "3:cpu:/kubepods/pod" + uid + "/" + cid + "\n2:memory:/kubepods/pod" + uid + "\n", Owner{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := Parse([]byte(tc.content))
			if err != nil || ok != tc.ok || got != tc.want {
				t.Errorf("Parse(%q) = %+v, %v, %v; want %+v, %v, nil", tc.content, got, ok, err, tc.want, tc.ok)
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, content, why string
	}{
		{"empty", "", "empty content"},
		{"blank line", "\n", "line 1:"},
		{"two fields", "0:/\n", "line 1:"},
		{"bad hierarchy ID", "x::/\n", `hierarchy ID "x"`},
		{"relative path", "0::kubepods\n", "does not start with /"},
		{"empty component", "0::/kubepods//pod" + uid + "\n", "empty path component"},
		{"trailing slash", "0::/kubepods/\n", "empty path component"},
		{"dots inside", "0::/kubepods/../pod" + uid + "\n", `".." after`},
		{"short cgroupfs UID", "0::/kubepods/burstable/pod1234/" + cid + "\n", "not a UUID"},
		{"bad systemd UID", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podzz" + uidU[2:] + ".slice/cri-containerd-" + cid + ".scope\n", "not a UUID"},
		{"empty systemd UID", "0::/kubepods.slice/kubepods-pod.slice\n", "not a UUID"},
		{"bad separator", "0::/kubepods/pod" + strings.ReplaceAll(uid, "-", ".") + "/" + cid + "\n", "not a UUID"},
		{"short container ID", "0::/kubepods/pod" + uid + "/cri-containerd-" + cid[:12] + ".scope\n", "not 64 hex"},
		{"bad conmon ID", "0::/kubepods/pod" + uid + "/crio-conmon-xyz.scope\n", "not 64 hex"},
		{"inline without ID", "0::/system.slice/containerd.service/kubepods-pod" + uidU + ".slice:cri-containerd\n", "not <runtime>:<id>"},
		{"inline bad ID", "0::/kubepods-pod" + uidU + ".slice:cri-containerd:" + cid + ":x\n", "not 64 hex"},
		{"bad line among good", "2:memory:/\n1:name=systemd:/init.scope\nnot a cgroup line\n", "line 3:"},
		{"repeated v2 line", "0::/init.scope\n0::/kubepods/pod" + uid + "/" + cid + "\n", "line 2: hierarchy"},
		{"repeated controller", "4:memory:/\n9:cpu,memory:/kubepods/pod" + uid + "/" + cid + "\n", "line 2: hierarchy"},
		{"forged line in a name", "2:memory:/kubepods/pod" + uid + "/" + cid + "/x\n2:memory:/kubepods/pod" + uid + "/" + cid + "\n", "line 2: hierarchy"},
		{"bad pod in second line", "3:cpu:/kubepods/pod" + uid + "/" + cid + "\n2:memory:/kubepods/podX/" + cid + "\n", "line 2:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := Parse([]byte(tc.content))
			if err == nil || ok || got != (Owner{}) {
				t.Fatalf("Parse(%q) = %+v, %v, %v; want an error", tc.content, got, ok, err)
			}
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("Parse(%q) error %q: want ErrMalformed mentioning %q", tc.content, err, tc.why)
			}
		})
	}
}

func TestRead(t *testing.T) {
	root := t.TempDir()
	write := func(pid, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("42", "0::/kubepods/burstable/pod"+uid+"/"+cid+"\n")
	write("43", "0::nope\n")

	got, ok, err := Read(root, 42)
	if err != nil || !ok || got != owner(uid, cid, QoSBurstable) {
		t.Errorf("Read(42) = %+v, %v, %v", got, ok, err)
	}
	if _, _, err := Read(root, 43); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), filepath.Join(root, "43", "cgroup")) {
		t.Errorf("Read(43) error = %v; want ErrMalformed naming the file", err)
	}
	if _, _, err := Read(root, 44); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read(44) error = %v; want fs.ErrNotExist", err)
	}
}

func TestReadSelf(t *testing.T) {
	// The test process's own cgroup file must parse, whatever it holds.
	if _, err := os.Stat("/proc/self/cgroup"); err != nil {
		t.Skip("no /proc/self/cgroup")
	}
	if _, _, err := Read("/proc", uint32(os.Getpid())); err != nil {
		t.Errorf("Read(/proc, self): %v", err)
	}
}
