"""Generated kubelet device-plugin API modules (hack/gen-deviceplugin-proto.sh); do not edit."""
