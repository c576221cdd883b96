// Package httpx holds what the outbox's HTTP clients (the http sink, the dead-letter
// alert webhook) share when they report a failed request.
package httpx

import (
	"errors"
	"io"
	"net/url"
	"strings"
)

// Snippet returns the start of a response body for an error message (": " and up to 256
// bytes, or "" for an empty body), and drains the rest so the connection can be reused.
func Snippet(r io.Reader) string {
	buf, _ := io.ReadAll(io.LimitReader(r, 256))
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 1<<20))
	s := strings.TrimSpace(strings.ToValidUTF8(string(buf), "?"))
	if s == "" {
		return ""
	}
	return ": " + s
}

// Unwrap drops the *url.Error wrapper of a failed request, whose text repeats the full
// URL (with whatever secret its user information, path or query holds); the caller names
// the URL through redact.URL instead.
func Unwrap(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}
