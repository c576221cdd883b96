// Package redact gives the one form of a URL that errors, logs, rows, dead letters, alerts
// and workflow histories may show: its scheme and host, nothing else. User information
// holds passwords, the query API keys, and the path of many webhooks (Slack, Teams,
// Discord) is their token, so none of them is shown.
package redact

import "strings"

// Unparsable is what URL shows for a value with no scheme://host.
const Unparsable = "(unparsable URL)"

// URL returns scheme://host[:port] of raw: no user information, path, query or fragment.
// It does not need raw to parse, since a password may hold characters (/, ?, #, a stray %)
// that break parsing; a value without "://" and a host shows as Unparsable.
func URL(raw string) string {
	// Not url.Parse: with a # or ? in an unencoded password it takes user and password
	// for the host ("amqp://user:1234#x@host" parses with host "user:1234").
	i := strings.Index(raw, "://")
	if i <= 0 {
		return Unparsable
	}
	scheme, rest := raw[:i], raw[i+3:]
	// User information runs to the last @ of the authority; a password may hold / ? or #
	// that were not percent-encoded, so look for it in the whole rest.
	if j := strings.LastIndex(rest, "@"); j >= 0 {
		rest = rest[j+1:]
	}
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		rest = rest[:j]
	}
	if rest == "" || strings.ContainsAny(scheme, "/?#@ ") {
		return Unparsable
	}
	return strings.ToLower(scheme) + "://" + rest
}
