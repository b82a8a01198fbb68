//! Kubernetes e2e harness: real API server, fake kubelet for mock workers (work in progress).
