package storedriver

import (
	"strings"
	"unicode/utf8"
)

// MaxErrorTextBytes bounds the error texts the store writes (last_error, a dead letter's
// reason, an audit entry's detail); a longer text is cut at a character boundary and ends
// with "…".
const MaxErrorTextBytes = 8 << 10

// StorableText returns s as a PostgreSQL text column can hold it. PostgreSQL refuses the
// NUL character in text and jsonb, and invalid UTF-8 in a UTF8 database, so a downstream
// that answers with a binary body, or a handler whose error holds such bytes, would make
// the write fail and leave the message wedged. NUL becomes the four characters `\x00`,
// invalid bytes U+FFFD, and the text is cut to MaxErrorTextBytes. Every error text the
// store writes goes through it.
func StorableText(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", `\x00`)
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= MaxErrorTextBytes {
		return s
	}
	const ellipsis = "…"
	cut := MaxErrorTextBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
