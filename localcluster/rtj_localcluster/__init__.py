"""An embedded, Kubernetes-compatible control plane whose kubelet runs containers as local processes."""
