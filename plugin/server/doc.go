// Package server is the kubelet-facing gRPC device plugin: it serves
// GetDevicePluginOptions, ListAndWatch and Allocate on a unix socket in the
// kubelet's device-plugin directory (injected, so tests and hollow kubelets
// use their own) and registers that socket with the kubelet.
//
// Start returns only once the socket answers a real gRPC call, because the
// kubelet dials the plugin as soon as Register returns and gives up on a
// socket that is not serving yet. Stop is idempotent and ends every
// ListAndWatch stream, which is how the kubelet learns the plugin went away.
// The server holds no pod logic: Allocate is delegated to an injected
// Allocator, and the device list is pushed in with SetDevices.
//
// DeviceList shapes one container's answer by the device-list strategy; under
// the CDI strategies it also names a device of the plugin's own CDI
// specification (LimitSpecs) whose edits are the isolation tier's variables,
// which a CDI runtime applies after the container's own environment.
package server
