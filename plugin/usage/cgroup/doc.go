// Package cgroup maps a process to the Kubernetes pod and container it runs
// in, from the content of its /proc/<pid>/cgroup file. The device plugin gets
// the PIDs using each GPU from NVML and uses this package to find their
// owners. Parse is a pure function of the file's content; Read only adds the
// file read.
//
// Forms covered:
//
//   - cgroup v2 (one "0::<path>" line) and cgroup v1 ("<id>:<controllers>:<path>"
//     lines). Of the v1 lines only the memory, cpu, cpuacct, pids and
//     name=systemd hierarchies (and a hybrid system's "0::" line) are read. When
//     they disagree, the memory line wins if it names a pod; otherwise the
//     first line, in file order, that names a pod.
//   - the systemd cgroup driver: kubepods.slice/kubepods[-<qos>].slice/
//     kubepods[-<qos>]-pod<uid_with_underscores>.slice/<runtime>-<64hex>.scope,
//     with the runtimes cri-containerd, crio and docker (cri-dockerd), and any
//     prefix slice before kubepods (kind's and k3s's kubelet.slice/
//     kubelet-kubepods.slice/...).
//   - the cgroupfs driver: kubepods[/burstable|/besteffort]/pod<uid>/<64hex>
//     (CRI-O writes crio-<64hex>), wherever it sits in the path (docker-in-docker
//     and kind on cgroup v1: /docker/<id>/kubepods/...).
//   - containerd's literal form of a systemd path when containerd itself runs
//     the cgroupfs driver: .../kubepods-<qos>-pod<uid>.slice:cri-containerd:<64hex>.
//   - paths relative to the reader's cgroup namespace ("/../../..."): they are
//     attributed when the part after the ".." run still shows the pod and
//     container (a cgroupfs "pod<uid>" right after ".." is accepted only when
//     the UID is valid, since its kubepods parent is out of sight); a bare "/"
//     (the reader's own namespace root) or a path with no pod is not.
//   - sub-cgroups below a container (".../cri-containerd-<id>.scope/init", or
//     cgroups the workload made itself): the container is the pod cgroup's
//     direct child, whatever lies below it.
//
// Not attributed (ok=false, no error): host processes (system.slice,
// user.slice, init.scope), QoS-level and pod-level cgroups with no container
// part, unknown children of a pod cgroup, and CRI-O's conmon scope
// (crio-conmon-<id>). Conmon is the runtime's monitor process, not the
// container: it lives outside the container's cgroup and limits and never
// holds a GPU context on the workload's behalf, so charging it to the
// container would be wrong. Note that a pod's pause (sandbox) process sits in
// a container cgroup of its own under containerd and Docker; it is returned
// with the sandbox ID as ContainerID, which the CRI lists as a sandbox, not a
// container.
//
// The first (outermost) pod component of a path is the one used. Anything
// below a container is the workload's to name, so a workload that delegates
// cgroups cannot pass its processes off as another pod's by nesting a
// pod-like cgroup.
//
// Strictness: a component that is shaped as a pod cgroup (a kubepods pod
// slice, or "pod..." under kubepods) must hold a valid UUID, and a container
// component with a known runtime prefix must hold 64 hex digits; otherwise
// Parse fails with an error wrapping ErrMalformed that names the line. So does
// a file that repeats a hierarchy ID or controller: the kernel writes cgroup
// names unescaped, so a workload can forge a line by putting a newline in the
// name of a cgroup it made. Pod
// UIDs come back canonical (8-4-4-4-12 lowercase hex, dashes), container IDs
// as 64 lowercase hex digits without the runtime prefix. Parse never panics.
//
// The package holds no package-level mutable state.
package cgroup
