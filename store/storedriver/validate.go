package storedriver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Validate checks msg against the limits every store shares, with payloads of at most
// maxPayload bytes, and returns a *ValidationError naming the first field that is wrong.
func Validate(msg Message, maxPayload int) error { return ValidateWith(msg, maxPayload, nil) }

// NumberRule is a database's own limit on the numbers of a payload, beyond those every
// store checks: Fits reports whether the JSON number num can be stored, and Range says
// what can, for the error ("MySQL's JSON type can store (a double)").
type NumberRule struct {
	Fits  func(num []byte) bool
	Range string
}

// ValidateWith is Validate with a database's own rule for the payload's numbers, checked
// in the same pass over the payload as the rules every store shares. A nil rule adds none.
func ValidateWith(msg Message, maxPayload int, numbers *NumberRule) error {
	if !TopicPattern.MatchString(msg.Topic) {
		return &ValidationError{"topic", fmt.Sprintf("must match %s, got %s", TopicPattern, quoteShort(msg.Topic))}
	}
	if err := validatePayload(msg.Payload, maxPayload, numbers); err != nil {
		return err
	}
	for k, v := range msg.Headers {
		if k == "" || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return &ValidationError{"headers", fmt.Sprintf("must have non-empty UTF-8 keys and values without NUL characters, got %s: %s", quoteShort(k), quoteShort(v))}
		}
	}
	if headerBytes := HeadersSize(msg.Headers); headerBytes > MaxHeadersBytes {
		return &ValidationError{"headers", fmt.Sprintf("must be at most %d bytes of keys and values together, got %d bytes in %d headers (put data in the payload)",
			MaxHeadersBytes, headerBytes, len(msg.Headers))}
	}
	if k := msg.OrderingKey; len(k) > 200 || strings.ContainsFunc(k, isControl) || !utf8.ValidString(k) || (k != "" && strings.TrimSpace(k) == "") {
		// The key travels as a header (Outbox-Ordering-Key), which cannot carry control
		// characters.
		return &ValidationError{"ordering_key", fmt.Sprintf("must be at most 200 bytes of text, not blank and without control characters (U+0000 to U+001F, U+007F), got %s", quoteShort(k))}
	}
	if k := msg.IdempotencyKey; len(k) > 200 || strings.ContainsRune(k, 0) || !utf8.ValidString(k) || (k != "" && strings.TrimSpace(k) == "") {
		return &ValidationError{"idempotency_key", fmt.Sprintf("must be at most 200 bytes of text, not blank and without NUL, got %s", quoteShort(k))}
	}
	if r := msg.MaxRetryTimes; r != nil && (*r < 0 || *r > MaxRetryTimesLimit) {
		return &ValidationError{"max_retry_times", fmt.Sprintf("must be between 0 and %d, got %d", MaxRetryTimesLimit, *r)}
	}
	if t := msg.DeliverAfter; !t.IsZero() {
		now := time.Now()
		if t.After(now.AddDate(1, 0, 0)) {
			return &ValidationError{"deliver_after", fmt.Sprintf("must be at most 1 year ahead, got %s (%s from now)",
				t.Format(time.RFC3339), t.Sub(now).Round(time.Second))}
		}
	}
	return nil
}

// ValidatePayload checks that p is one JSON value of at most maxBytes bytes that
// PostgreSQL's jsonb can store: UTF-8, no \u0000 and no lone UTF-16 surrogate escape in
// any string, and numbers within the range of numeric. jsonb writes its numbers out in
// full (1e3 is stored as 1000), so p must also be at most maxBytes bytes with its numbers
// written that way: a payload read back is then within the limit as [PayloadSize]
// measures it. Every store counts alike, so a message is accepted or refused the same
// whichever store it goes to.
func ValidatePayload(p []byte, maxBytes int) error { return validatePayload(p, maxBytes, nil) }

func validatePayload(p []byte, maxBytes int, numbers *NumberRule) error {
	if len(bytes.TrimSpace(p)) == 0 {
		return &ValidationError{"payload", "must be a JSON value, got nothing"}
	}
	if len(p) > maxBytes {
		return &ValidationError{"payload", fmt.Sprintf("must be at most %d bytes, got %d bytes", maxBytes, len(p))}
	}
	if !utf8.Valid(p) {
		return &ValidationError{"payload", "must be UTF-8 text, got invalid UTF-8"}
	}
	if !json.Valid(p) {
		return &ValidationError{"payload", fmt.Sprintf("must be valid JSON, got %s", quoteShort(string(p)))}
	}
	growth, err := checkJSON(p, numbers)
	if err != nil {
		return err
	}
	if stored := len(p) + growth.bytes; stored > maxBytes {
		return &ValidationError{"payload", fmt.Sprintf("must be at most %d bytes, got %d bytes as PostgreSQL's jsonb stores it, "+
			"which writes numbers out in full (%s takes %d bytes)", maxBytes, stored, quoteShort(string(growth.largest)), growth.largestWidth)}
	}
	return nil
}

// PayloadSize is the size of the JSON text p as a send measures a stored payload against
// the limit: its bytes outside the whitespace between tokens (the length of its compact
// form). A database prints the JSON it stores in a form of its own (PostgreSQL's jsonb
// and MySQL's JSON type put a space after each colon and comma), which the limit does not
// count. Whatever ValidatePayload accepts measures at most the limit read back from
// PostgreSQL or from MariaDB (which keeps the text as written).
func PayloadSize(p []byte) int {
	n, _ := PayloadSizes(p)
	return n
}

// EncodedPayloadSize is the size of the JSON text p as the Temporal SDK's default JSON
// converter writes it into a workflow's or an activity's input or result, which is how a
// payload reaches a team's activity, workflow or Nexus operation: compact, with each <, >
// and & escaped to six bytes (\u003c), and U+2028 and U+2029 likewise. Temporal refuses
// an input past its blob size limit, so a payload whose encoded size is over
// HardMaxPayloadBytes cannot reach a team's handler, however small its text.
func EncodedPayloadSize(p []byte) int {
	_, n := PayloadSizes(p)
	return n
}

// PayloadSizes returns both measures of the JSON text p in one pass: PayloadSize and
// EncodedPayloadSize. The characters the encoding escapes can stand only inside strings.
func PayloadSizes(p []byte) (compact, encoded int) {
	escapes, inString := 0, false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case inString:
			compact++
			switch {
			case c == '\\':
				if i+1 < len(p) { // the escaped byte, which cannot end the string
					i++
					compact++
				}
			case c == '"':
				inString = false
			case c == '<' || c == '>' || c == '&':
				escapes += 5
			case c == 0xE2 && i+2 < len(p) && p[i+1] == 0x80 && (p[i+2] == 0xA8 || p[i+2] == 0xA9):
				compact += 2
				escapes += 3
				i += 2
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		default:
			compact++
			inString = c == '"'
		}
	}
	return compact, compact + escapes
}

// numberGrowth is how much longer a payload's numbers are as jsonb stores them than as
// written: in all (bytes), and the number that grows most.
type numberGrowth struct {
	bytes        int
	largest      []byte
	largestWidth int
}

// checkJSON walks valid JSON text once for what jsonb refuses although JSON allows it, and
// for the numbers that numbers, when not nil, refuses. It returns how much longer jsonb
// writes the numbers.
func checkJSON(p []byte, numbers *NumberRule) (numberGrowth, error) {
	var growth numberGrowth
	bad := func(format string, args ...any) (numberGrowth, error) {
		return growth, &ValidationError{"payload", fmt.Sprintf(format, args...)}
	}
	inString := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if inString {
			switch c {
			case '"':
				inString = false
			case '\\':
				i++
				if p[i] != 'u' {
					continue
				}
				r := hex4(p[i+1 : i+5])
				i += 4
				switch {
				case r == 0:
					return bad(`must not contain \u0000 (PostgreSQL jsonb cannot store it), found at byte %d`, i-5)
				case r >= 0xD800 && r < 0xDC00:
					if i+6 < len(p) && p[i+1] == '\\' && p[i+2] == 'u' {
						if low := hex4(p[i+3 : i+7]); low >= 0xDC00 && low < 0xE000 {
							i += 6
							continue
						}
					}
					return bad(`must not contain a lone UTF-16 surrogate escape (\u%04x at byte %d): PostgreSQL jsonb refuses it`, r, i-5)
				case r >= 0xDC00 && r < 0xE000:
					return bad(`must not contain a lone UTF-16 surrogate escape (\u%04x at byte %d): PostgreSQL jsonb refuses it`, r, i-5)
				}
			}
			continue
		}
		switch {
		case c == '"':
			inString = true
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(p) && strings.IndexByte("0123456789+-.eE", p[j]) >= 0 {
				j++
			}
			if !numericFits(p[i:j]) {
				return bad("number %s is outside the range PostgreSQL's jsonb can store", quoteShort(string(p[i:j])))
			}
			if numbers != nil && !numbers.Fits(p[i:j]) {
				return bad("number %s is outside the range %s", quoteShort(string(p[i:j])), numbers.Range)
			}
			if w := numericWidth(p[i:j]); w > j-i {
				growth.bytes += w - (j - i)
				if w-(j-i) > growth.largestWidth-len(growth.largest) {
					growth.largest, growth.largestWidth = p[i:j], w
				}
			}
			i = j - 1
		}
	}
	return growth, nil
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r
}

// numericFits reports whether a JSON number fits PostgreSQL's numeric, as numeric_in reads
// it: an exponent below 2^30 either way; a scale (the digits written after the decimal
// point, trailing zeros included, less the exponent) of at most 16383, zero included
// (0.0e-16383 overflows); and, unless it is zero, at most 131072 digits before the point.
func numericFits(num []byte) bool {
	s := strings.TrimPrefix(string(num), "-")
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	e := 0
	if exp != "" {
		v, err := strconv.Atoi(exp)
		if err != nil || v >= maxNumericExponent || v <= -maxNumericExponent {
			return false
		}
		e = v
	}
	if len(frac)-e > 16383 {
		return false
	}
	intPart = strings.TrimLeft(intPart, "0")
	if strings.Trim(intPart+frac, "0") == "" {
		return true // zero: no digits before the point
	}
	before := len(intPart) + e
	if intPart == "" { // 0.000123: leading zeros of the fraction do not count
		before = e - (len(frac) - len(strings.TrimLeft(frac, "0")))
	}
	return before <= 131072
}

// numericWidth is the length of num, a JSON number that numericFits, as jsonb stores and
// prints it (PostgreSQL's numeric_out): without an exponent or leading zeros, with the
// digits after the point that the text implies (1e3 is 1000, 1.50e1 is 15.0, 1e-3 is
// 0.001, 100e-2 is 1.00, -0.0 is 0.0).
func numericWidth(num []byte) int {
	s := string(num)
	neg := strings.HasPrefix(s, "-")
	mant, exp, _ := strings.Cut(strings.ToLower(strings.TrimPrefix(s, "-")), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	e, _ := strconv.Atoi(exp) // numericFits has read it
	digits := strings.TrimLeft(intPart+frac, "0")
	width := 1 // a lone 0 before the point
	if digits != "" {
		// The significant digits that stand before the point, the zeros the exponent
		// adds included.
		before := len(intPart) + e - (len(intPart) + len(frac) - len(digits))
		width = max(before, 1)
		if neg {
			width++ // numeric has no negative zero, so only a nonzero number keeps its sign
		}
	}
	if scale := len(frac) - e; scale > 0 {
		width += 1 + scale
	}
	return width
}

// maxNumericExponent is the exponent numeric_in refuses whatever the digits (INT_MAX/2).
const maxNumericExponent = 1<<30 - 1

// isControl reports whether r is an ASCII control character, which an HTTP header value
// (or another protocol's header) cannot carry.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func quoteShort(s string) string {
	const max = 80
	if len(s) > max {
		return fmt.Sprintf("%q... (%d bytes)", s[:max], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// ValidatePause checks the arguments of Operations.PauseTopic and names the first one
// that is wrong, with its value and what is allowed.
func ValidatePause(topic, actor, reason string) error {
	if !TopicPattern.MatchString(topic) {
		return fmt.Errorf("topic must match %s, got %s", TopicPattern, quoteShort(topic))
	}
	if len(actor) > 200 || strings.ContainsRune(actor, 0) || !utf8.ValidString(actor) || strings.TrimSpace(actor) == "" {
		return fmt.Errorf("actor must be 1 to 200 bytes of text without NUL, got %s", quoteShort(actor))
	}
	if len(reason) > 1000 || strings.ContainsRune(reason, 0) || !utf8.ValidString(reason) {
		return fmt.Errorf("reason must be at most 1000 bytes of text without NUL, got %d bytes", len(reason))
	}
	return nil
}
