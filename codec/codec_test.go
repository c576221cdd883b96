package codec_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/outbox-go/outbox/codec"
)

func newKey(t *testing.T, id string) codec.Key {
	t.Helper()
	secret := make([]byte, codec.KeySize)
	_, err := rand.Read(secret)
	require.NoError(t, err)
	return codec.Key{ID: id, Secret: secret}
}

func payloads(t *testing.T, values ...any) []*commonpb.Payload {
	t.Helper()
	var out []*commonpb.Payload
	for _, v := range values {
		p, err := converter.GetDefaultDataConverter().ToPayload(v)
		require.NoError(t, err)
		out = append(out, p)
	}
	return out
}

func TestCodec(t *testing.T) {
	t.Parallel()
	k1, k2 := newKey(t, "k1"), newKey(t, "k2")

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		c, err := codec.New("k1", k1)
		require.NoError(t, err)
		in := payloads(t, map[string]string{"message_id": "0192f0c4-secret"}, "plain text", nil)
		enc, err := c.Encode(in)
		require.NoError(t, err)
		require.Len(t, enc, len(in))
		for _, p := range enc {
			require.Equal(t, codec.EncodingEncrypted, string(p.Metadata[codec.MetadataEncoding]))
			require.Equal(t, "k1", string(p.Metadata[codec.MetadataKeyID]))
			require.Len(t, p.Metadata, 2, "the original metadata is sealed inside")
			require.NotContains(t, string(p.Data), "secret")
			require.NotContains(t, string(p.Data), "json/plain")
		}
		dec, err := c.Decode(enc)
		require.NoError(t, err)
		for i := range in {
			require.Equal(t, in[i].Metadata, dec[i].Metadata)
			require.Equal(t, in[i].Data, dec[i].Data)
		}
		// The same plaintext encrypts differently each time.
		again, err := c.Encode(in[:1])
		require.NoError(t, err)
		require.NotEqual(t, enc[0].Data, again[0].Data)
	})

	t.Run("UnencryptedPayloadsPassThrough", func(t *testing.T) {
		t.Parallel()
		c, err := codec.New("k1", k1)
		require.NoError(t, err)
		in := payloads(t, "written before the codec")
		dec, err := c.Decode(in)
		require.NoError(t, err)
		require.Equal(t, in[0].Data, dec[0].Data)
	})

	t.Run("Rotation", func(t *testing.T) {
		t.Parallel()
		old, err := codec.New("k1", k1)
		require.NoError(t, err)
		oldEnc, err := old.Encode(payloads(t, "old"))
		require.NoError(t, err)

		rotated, err := codec.New("k2", k1, k2)
		require.NoError(t, err)
		require.Equal(t, "k2", rotated.ActiveKeyID())
		require.Equal(t, []string{"k1", "k2"}, rotated.KeyIDs())
		newEnc, err := rotated.Encode(payloads(t, "new"))
		require.NoError(t, err)
		require.Equal(t, "k2", string(newEnc[0].Metadata[codec.MetadataKeyID]))

		dec, err := rotated.Decode(append(oldEnc, newEnc...))
		require.NoError(t, err)
		var s string
		require.NoError(t, converter.GetDefaultDataConverter().FromPayload(dec[0], &s))
		require.Equal(t, "old", s)
		require.NoError(t, converter.GetDefaultDataConverter().FromPayload(dec[1], &s))
		require.Equal(t, "new", s)
	})

	t.Run("UnknownKeyID", func(t *testing.T) {
		t.Parallel()
		c2, err := codec.New("k2", k2)
		require.NoError(t, err)
		enc, err := c2.Encode(payloads(t, "x"))
		require.NoError(t, err)
		c1, err := codec.New("k1", k1)
		require.NoError(t, err)
		_, err = c1.Decode(enc)
		require.ErrorContains(t, err, `key "k2", which is not configured (configured: k1)`)
	})

	t.Run("TamperedCiphertext", func(t *testing.T) {
		t.Parallel()
		c, err := codec.New("k1", k1)
		require.NoError(t, err)
		for name, tamper := range map[string]func(p *commonpb.Payload){
			"FlippedBit": func(p *commonpb.Payload) { p.Data[len(p.Data)-1] ^= 1 },
			"Truncated":  func(p *commonpb.Payload) { p.Data = p.Data[:5] },
			"OtherKeyID": func(p *commonpb.Payload) { p.Metadata[codec.MetadataKeyID] = []byte("k2") },
		} {
			enc, err := c.Encode(payloads(t, "x"))
			require.NoError(t, err)
			tamper(enc[0])
			both, err := codec.New("k1", k1, codec.Key{ID: "k2", Secret: k1.Secret})
			require.NoError(t, err)
			_, err = both.Decode(enc)
			require.Error(t, err, name)
			require.Regexp(t, `failed authentication|truncated`, err.Error(), name)
		}
	})

	t.Run("BadKeys", func(t *testing.T) {
		t.Parallel()
		_, err := codec.New("k1")
		require.ErrorContains(t, err, "no keys")
		_, err = codec.New("k3", k1, k2)
		require.ErrorContains(t, err, `active key "k3" is not among the keys (k1, k2)`)
		_, err = codec.New("k1", k1, k1)
		require.ErrorContains(t, err, `"k1" given twice`)
		_, err = codec.New("k1", codec.Key{ID: "k1", Secret: []byte("short")})
		require.ErrorContains(t, err, "has 5 bytes, want 32")
		_, err = codec.New("bad id", codec.Key{ID: "bad id", Secret: k1.Secret})
		require.ErrorContains(t, err, "key ID must match")
	})

	t.Run("KeyNeverPrinted", func(t *testing.T) {
		t.Parallel()
		for _, s := range []string{fmt.Sprint(k1), fmt.Sprintf("%v %+v %#v %s", k1, k1, k1, k1)} {
			require.NotContains(t, s, string(k1.Secret))
			require.NotContains(t, s, base64.StdEncoding.EncodeToString(k1.Secret))
		}
	})
}

func TestKeyFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := newKey(t, "k1")
	b64 := base64.StdEncoding.EncodeToString(k.Secret)

	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	got, err := codec.ReadKeyFile("k1", write("b64", []byte(b64+"\n")))
	require.NoError(t, err)
	require.Equal(t, k.Secret, got.Secret)
	got, err = codec.ReadKeyFile("k1", write("raw", k.Secret))
	require.NoError(t, err)
	require.Equal(t, k.Secret, got.Secret)

	shortSecret := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	_, err = codec.ReadKeyFile("k1", write("short", []byte(shortSecret)))
	require.ErrorContains(t, err, "decodes to 16 bytes, want 32")
	require.NotContains(t, err.Error(), shortSecret)
	_, err = codec.ReadKeyFile("k1", write("garbage", []byte("not base64 at all: hunter2")))
	require.ErrorContains(t, err, "not valid base64")
	require.NotContains(t, err.Error(), "hunter2")
	_, err = codec.ReadKeyFile("k1", filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, "missing")

	_, err = codec.ParseKey("env", "!!"+b64)
	require.ErrorContains(t, err, "not valid base64")
	require.NotContains(t, err.Error(), b64)
}

func TestConverters(t *testing.T) {
	t.Parallel()
	c, err := codec.New("k1", newKey(t, "k1"))
	require.NoError(t, err)
	dc := codec.DataConverter(c)
	p, err := dc.ToPayload("the message")
	require.NoError(t, err)
	require.NotContains(t, string(p.Data), "the message")
	var s string
	require.NoError(t, dc.FromPayload(p, &s))
	require.Equal(t, "the message", s)

	// Failure messages are moved into the encrypted attributes.
	fc := codec.FailureConverter(dc)
	f := fc.ErrorToFailure(temporal.NewApplicationError("HTTP 500 from https://sink/secret-path", "Send"))
	require.NotContains(t, f.GetMessage(), "secret-path")
	require.NotContains(t, string(f.GetEncodedAttributes().GetData()), "secret-path")
	back := fc.FailureToError(f)
	require.ErrorContains(t, back, "secret-path")
	require.NotContains(t, f.GetMessage(), "secret-path", "reading a failure leaves it encoded (a local activity's marker is read before it is sent)")
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(back, &appErr))
}

func TestHTTPHandler(t *testing.T) {
	t.Parallel()
	c, err := codec.New("k1", newKey(t, "k1"))
	require.NoError(t, err)
	srv := httptest.NewServer(codec.NewHTTPHandler(c, "http://127.0.0.1:8233"))
	t.Cleanup(srv.Close)

	enc, err := c.Encode(payloads(t, "hello"))
	require.NoError(t, err)
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: enc})
	require.NoError(t, err)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/decode", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "http://127.0.0.1:8233")
	req.Header.Set("X-Namespace", "default")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	require.Equal(t, "http://127.0.0.1:8233", resp.Header.Get("Access-Control-Allow-Origin"))
	var decoded commonpb.Payloads
	require.NoError(t, protojson.Unmarshal(out, &decoded))
	var s string
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(decoded.Payloads[0], &s))
	require.Equal(t, "hello", s)

	// The browser's preflight.
	req, err = http.NewRequest(http.MethodOptions, srv.URL+"/decode", nil)
	require.NoError(t, err)
	req.Header.Set("Origin", "http://127.0.0.1:8233")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Access-Control-Allow-Headers"), "X-Namespace")

	// Another origin is refused before anything is decoded, whatever its content type
	// (a text/plain POST needs no preflight) and its preflight too: a page a DNS
	// rebinding makes same-origin to the browser still names its own origin.
	for _, method := range []string{http.MethodPost, http.MethodOptions} {
		for _, contentType := range []string{"application/json", "text/plain"} {
			req, err = http.NewRequest(method, srv.URL+"/decode", bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Origin", "http://evil.example:8081")
			req.Header.Set("Content-Type", contentType)
			resp, err = http.DefaultClient.Do(req)
			require.NoError(t, err)
			out, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %s", method, contentType)
			require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
			require.NotContains(t, string(out), "payloads")
			require.Contains(t, string(out), `origin "http://evil.example:8081" is not allowed`)
		}
	}

	// A payload under an unknown key is refused with the key named.
	other, err := codec.New("k9", newKey(t, "k9"))
	require.NoError(t, err)
	enc, err = other.Encode(payloads(t, "x"))
	require.NoError(t, err)
	body, err = protojson.Marshal(&commonpb.Payloads{Payloads: enc})
	require.NoError(t, err)
	resp, err = http.Post(srv.URL+"/decode", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	out, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.True(t, strings.Contains(string(out), `"k9"`), string(out))
}
