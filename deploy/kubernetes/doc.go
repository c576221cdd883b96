// Package kubernetes holds the test of the Kubernetes manifests beside it (a ConfigMap
// with outbox.yaml, the Deployment running outbox run, the migrate Job and the
// PodDisruptionBudget): each decodes strictly into its Kubernetes API type, the
// configuration is valid, and the objects agree with each other, with the outbox
// command's subcommands and flags, and with the image the Dockerfile builds. It is a
// module of its own so that k8s.io stays out of the library's module graph.
package kubernetes
