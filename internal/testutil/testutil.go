// Package testutil holds what the outbox's test packages share: free ports, building the
// outbox binary, a /metrics scrape, and an idempotent downstream for
// the HTTP sink. Only tests import it.
package testutil

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FreePorts returns n distinct free loopback ports.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		require.NoError(t, l.Close())
	}
	return ports
}

// RepoRoot returns the repository's root folder (the one holding go.work).
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("runtime.Caller failed")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		return "", fmt.Errorf("no go.work in %s: %w", root, err)
	}
	return filepath.Abs(root)
}

// BuildOutbox builds the outbox binary (every command, outbox dev included) into dir and
// returns its path.
func BuildOutbox(dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", bin, "./cmd/outbox")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/outbox: %v\n%s", err, out)
	}
	return bin, nil
}

// HTTPGet fetches url and returns the status code and the body.
func HTTPGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// Scrape reads an endpoint in the Prometheus text format into series → value, the series
// written as the exposition writes it: name{label="value",...}.
func Scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	code, body := HTTPGet(t, url)
	require.Equal(t, http.StatusOK, code, body)
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, "line %q", line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, "line %q", line)
		out[line[:i]] = v
	}
	return out
}

// Seed returns the seed of a test's random choices: OUTBOX_TEST_SEED when set, else a new
// one. It logs the seed, so a failing run can be repeated with the same choices.
func Seed(t testing.TB) uint64 {
	t.Helper()
	if s := os.Getenv("OUTBOX_TEST_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "OUTBOX_TEST_SEED=%q is not an unsigned integer", s)
		t.Logf("random choices from OUTBOX_TEST_SEED=%d", seed)
		return seed
	}
	seed := rand.Uint64()
	t.Logf("random choices from seed %d (OUTBOX_TEST_SEED=%d repeats them)", seed, seed)
	return seed
}
