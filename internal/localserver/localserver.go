// Package localserver holds what outbox dev's private database servers (a PostgreSQL
// cluster, a MariaDB server) share: a port on 127.0.0.1 that survives restarts, and the
// end of a log to show when a server fails to start.
package localserver

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
)

// ChoosePort returns port when it is not 0, else the port of the last run (kept in
// portFile) when it is free, else any free port; it records the choice in portFile.
func ChoosePort(portFile string, port int) (int, error) {
	if port == 0 {
		if b, err := os.ReadFile(portFile); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 && PortFree(p) {
				port = p
			}
		}
	}
	if port == 0 {
		var err error
		if port, err = FreePort(); err != nil {
			return 0, err
		}
	}
	_ = os.WriteFile(portFile, []byte(strconv.Itoa(port)+"\n"), 0o644)
	return port, nil
}

// FreePort returns a port of 127.0.0.1 that nothing listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PortFree reports whether nothing listens on port of 127.0.0.1.
func PortFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Tail returns the last n lines of the file at path, or "" when it cannot be read.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	return LastLines(b, n)
}

// LastLines returns the last n lines of out.
func LastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
