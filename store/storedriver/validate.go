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
// any string, and numbers within the range of numeric.
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
	return checkJSON(p, numbers)
}

// checkJSON walks valid JSON text once for what jsonb refuses although JSON allows it, and
// for the numbers that numbers, when not nil, refuses.
func checkJSON(p []byte, numbers *NumberRule) error {
	bad := func(format string, args ...any) error {
		return &ValidationError{"payload", fmt.Sprintf(format, args...)}
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
			i = j - 1
		}
	}
	return nil
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
