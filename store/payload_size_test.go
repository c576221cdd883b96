package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestPayloadSizeAsStored pins the two measures of a payload against PostgreSQL's own
// printing of jsonb: ValidatePayload counts each number at the width jsonb writes it (no
// exponent, the text's scale kept), exactly, and PayloadSize measures a stored payload
// as its compact form, whatever spaces jsonb puts in.
func TestPayloadSizeAsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testdb.Schema(t)

	t.Run("NumbersAreCountedAsJSONBWritesThem", func(t *testing.T) {
		t.Parallel()
		literals := []string{"0", "-0", "-0.0", "0.000", "0e5", "0.0e-3", "1", "-1", "10.0", "1e3", "1E+2", "1.50e1",
			"0.1e1", "100e-2", "5e-1", "1e-3", "1.0e-5", "123.45e-1", "-12e-5", "-1.5e300", "1e2000", "9.99e-40"}
		rng := rand.New(rand.NewPCG(1, 2))
		for range 400 {
			literals = append(literals, randomNumber(rng))
		}
		var widths []int
		require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(length(('[' || l || ']')::jsonb::text) - 2 ORDER BY n)
FROM unnest($1::text[]) WITH ORDINALITY AS u(l, n)`, literals).Scan(&widths))
		for i, lit := range literals {
			// A payload counts as its text, plus what jsonb adds to its numbers.
			size := 2 + max(len(lit), widths[i])
			p := []byte("[" + lit + "]")
			require.NoError(t, store.ValidatePayload(p, size), "%s is %d bytes in jsonb", lit, widths[i])
			err := store.ValidatePayload(p, size-1)
			var verr *store.ValidationError
			require.ErrorAs(t, err, &verr, "%s is %d bytes in jsonb", lit, widths[i])
			require.Equal(t, "payload", verr.Field)
			require.Contains(t, verr.Reason, fmt.Sprintf("got %d bytes", size))
		}
	})

	t.Run("StoredPayloadsAreMeasuredCompact", func(t *testing.T) {
		t.Parallel()
		payloads := []string{
			`{"a":1,"b":[1,2,{"c":null}],"d":{"e":"f"}}`,
			`{"s":"a, b: c","t":"\" , : \\","u":"\\\\"}`,
			`[ "x" , "y\"" , { } , [ ] ]`,
			`{"tab\there":"line\nbreak","\u00e9":"\ud83d\ude00","slash":"\/"}`,
			`{"dup":1,"dup":2,"n":1.50e1}`,
			`"just a string with  two spaces"`,
			`12.5`,
		}
		var back []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(p::jsonb::text ORDER BY n) FROM unnest($1::text[]) WITH ORDINALITY AS u(p, n)`,
			payloads).Scan(&back))
		for i, b := range back {
			var compact bytes.Buffer
			require.NoError(t, json.Compact(&compact, []byte(b)))
			require.Equal(t, compact.Len(), store.PayloadSize([]byte(b)), "%s", b)
			require.LessOrEqual(t, store.PayloadSize([]byte(b)), len(payloads[i]), "%s read back as %s", payloads[i], b)
		}
		require.Equal(t, 11, store.PayloadSize([]byte("{\n  \"a\": [1, 2]\n}\t")))
	})
}

// randomNumber returns a JSON number of the shapes a payload may hold: a sign, an integer
// part, a fraction with zeros in it, an exponent.
func randomNumber(rng *rand.Rand) string {
	var b strings.Builder
	if rng.IntN(3) == 0 {
		b.WriteByte('-')
	}
	if rng.IntN(3) == 0 {
		b.WriteByte('0')
	} else {
		b.WriteByte(byte('1' + rng.IntN(9)))
		for range rng.IntN(6) {
			b.WriteByte(byte('0' + rng.IntN(10)))
		}
	}
	if rng.IntN(2) == 0 {
		b.WriteByte('.')
		for range 1 + rng.IntN(6) {
			b.WriteByte("0000123456789"[rng.IntN(13)])
		}
	}
	if rng.IntN(2) == 0 {
		b.WriteString([]string{"e", "E", "e+", "e-", "E-"}[rng.IntN(5)])
		fmt.Fprint(&b, rng.IntN(60))
	}
	return b.String()
}
