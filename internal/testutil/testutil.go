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

// FreePorts returns n distinct free loopback ports, for servers a test starts later (and
// may restart on the same ports). They are taken below the system's ephemeral range
// (Linux's ip_local_port_range), from which the outgoing connections of every test take
// their local ports: a port from that range, free when picked, can be a connection's by
// the time the server binds it. Where the range cannot be read, the system picks.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	low := ephemeralLow()
	for range n {
		var l net.Listener
		for try := 0; l == nil && low > minPort+1000 && try < 200; try++ {
			p := minPort + rand.IntN(low-minPort)
			if reservedPorts[p] {
				continue
			}
			l, _ = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		}
		if l == nil {
			var err error
			l, err = net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		require.NoError(t, l.Close())
	}
	return ports
}

// minPort is the lowest port FreePorts picks: above those of the services the tests use
// (PostgreSQL, MariaDB, RabbitMQ, NATS, Kafka, Temporal's defaults).
const minPort = 10000

// reservedPorts are ports in FreePorts' range that services the tests run may take
// (RabbitMQ's management, distribution and metrics ports).
var reservedPorts = map[int]bool{15672: true, 15692: true, 25672: true}

// ephemeralLow returns the lowest port of the system's ephemeral range, or 0 when it
// cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 0
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0
	}
	return low
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
