// Package e2e holds the end-to-end tests: real PostgreSQL, the Temporal server in-process,
// the relay and the worker as a deployment runs them. It is the one test package that
// links the Temporal server.
package e2e
