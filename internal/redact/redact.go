// Package redact gives the one form of a URL that errors, logs, rows, dead letters, alerts
// and workflow histories may show: its scheme and host, nothing else. User information
// holds passwords, the query API keys, and the path of many webhooks (Slack, Teams,
// Discord) is their token, so none of them is shown.
package redact

import (
	"regexp"
	"strings"
)

// Unparsable is what URL shows for a value whose host it cannot tell apart from the rest.
const Unparsable = "(unparsable URL)"

// hostPort is a host (a name, an IPv4 address or a bracketed IPv6 address) and an
// optional numeric port: what URL may show after the scheme.
var hostPort = regexp.MustCompile(`^([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$`)

// URL returns scheme://host[:port] of raw: no user information, path, query or fragment.
// It does not need raw to parse, since a password may hold characters (/, ?, #, a stray %)
// that break parsing. When the host cannot be told apart from a password or a path for
// sure, it shows Unparsable rather than guess.
func URL(raw string) string {
	// Not url.Parse: with a # or ? in an unencoded password it takes user and password
	// for the host ("amqp://user:1234#x@host" parses with host "user:1234").
	i := strings.Index(raw, "://")
	if i <= 0 || strings.ContainsAny(raw[:i], "/?#@ ") {
		return Unparsable
	}
	scheme, rest := strings.ToLower(raw[:i]), raw[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	var host string
	switch at := strings.LastIndex(rest, "@"); {
	case strings.Contains(authority, "@"):
		// user:password@host: the password may itself hold an @.
		host = authority[strings.LastIndex(authority, "@")+1:]
	case at < 0:
		host = authority
	case hostPort.MatchString(authority) && !strings.Contains(authority, ":"):
		// A plain host; the @ is in the path or the query (?from=ops@example.com).
		host = authority
	case !hostPort.MatchString(authority):
		// "user:pa" before a / ? or # of the password: the host follows the last @.
		host = rest[at+1:]
		if j := strings.IndexAny(host, "/?#"); j >= 0 {
			host = host[:j]
		}
	default:
		// host:port before an @ of the path, or user:1234 before a # of the password:
		// either may be the secret.
		return Unparsable
	}
	if !hostPort.MatchString(host) {
		return Unparsable
	}
	return scheme + "://" + host
}

// URLs is URL for a comma-separated list of URLs (a NATS cluster's servers).
func URLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = URL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// Error returns err's text with each URL of the comma-separated list replaced by its
// redacted form, for a client library that quotes the URL it was given.
func Error(err error, list string) string {
	text := err.Error()
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p != "" {
			text = strings.ReplaceAll(text, p, URL(p))
		}
	}
	return text
}

// Address is a host:port (a Kafka seed broker, say) as errors may show it: a URL goes
// through URL, and the user information of user:password@host:port, which may hold a
// password, is hidden. So is the value of a key=value pair whose key names a secret
// (password=, token=, ...), as in a malformed libpq connection string.
func Address(s string) string {
	// First the secrets' values, which may hold an @ or ://.
	s = secretValue.ReplaceAllString(s, "${1}=(hidden)")
	if strings.Contains(s, "://") {
		return URL(s)
	}
	if i := strings.LastIndex(s, "@"); i >= 0 {
		return "(user information hidden)@" + s[i+1:]
	}
	return s
}

// secretValue is a key=value pair whose key names a secret, with its value bare or
// quoted (libpq's quotes, with backslash escapes).
var secretValue = regexp.MustCompile(`(?i)([a-z_]*(?:pass|pwd|secret|token)[a-z_]*)\s*=\s*(?:'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s'"]+)`)
