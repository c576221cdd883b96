// Package codec encrypts the payloads a Temporal client sends, so that workflow inputs,
// activity inputs and results, and failure messages are stored in Temporal's history as
// AES-256-GCM ciphertext.
//
// A [Codec] holds one or more keys, each with an ID. It encrypts with the active key and
// records that key's ID in the payload's metadata, so it can decrypt payloads written
// with any of its keys: to rotate, add a new key, make it active, and keep the old ones
// until no history needs them.
//
// Use it on every client that talks to the namespace (worker, relay, and tools that read
// results) through [DataConverter] and [FailureConverter], and serve it to the Temporal
// Web UI with [NewHTTPHandler] (`outbox codec-server`).
package codec

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"

	commonpb "go.temporal.io/api/common/v1"
	failurepb "go.temporal.io/api/failure/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/proto"
)

// Metadata written on an encrypted payload.
const (
	// MetadataEncoding is the metadata key of a payload's encoding.
	MetadataEncoding = converter.MetadataEncoding
	// EncodingEncrypted is the encoding of an encrypted payload.
	EncodingEncrypted = "binary/encrypted"
	// MetadataKeyID is the metadata key naming the key that encrypted the payload.
	MetadataKeyID = "encryption-key-id"
	// KeySize is the length of a key in bytes (AES-256).
	KeySize = 32
)

// KeyIDPattern is what a key ID must match.
var KeyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Key is one encryption key.
type Key struct {
	// ID names the key in the payloads it encrypts. It must match [KeyIDPattern] and
	// never be reused for a different key.
	ID string
	// Secret is the 32-byte AES-256 key.
	Secret []byte
}

// String leaves the secret out, so a Key never ends up in a log by accident.
func (k Key) String() string { return fmt.Sprintf("codec key %q", k.ID) }

// GoString leaves the secret out too.
func (k Key) GoString() string { return k.String() }

// ParseKey reads a key given as standard base64 of 32 bytes. Errors never contain the
// key material.
func ParseKey(id, b64 string) (Key, error) {
	secret, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return Key{}, fmt.Errorf("key %q: not valid base64 (want standard base64 of %d random bytes, e.g. from `openssl rand -base64 32`)", id, KeySize)
	}
	if len(secret) != KeySize {
		return Key{}, fmt.Errorf("key %q: decodes to %d bytes, want %d", id, len(secret), KeySize)
	}
	return Key{ID: id, Secret: secret}, nil
}

// ReadKeyFile reads a key file: base64 of 32 bytes (surrounding space ignored), or the 32
// raw bytes. Errors name the file, never its contents.
func ReadKeyFile(id, path string) (Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Key{}, fmt.Errorf("key %q: %w", id, err)
	}
	if len(data) == KeySize && !isBase64Text(data) {
		return Key{ID: id, Secret: data}, nil
	}
	k, err := ParseKey(id, string(data))
	if err != nil {
		return Key{}, fmt.Errorf("%w (file %s)", err, path)
	}
	return k, nil
}

func isBase64Text(b []byte) bool {
	for _, c := range bytes.TrimSpace(b) {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return true
}

// Codec is an AES-256-GCM [converter.PayloadCodec] with key rotation. It is safe for
// concurrent use.
type Codec struct {
	active string
	aeads  map[string]cipher.AEAD
	ids    []string
}

var _ converter.PayloadCodec = (*Codec)(nil)

// New returns a codec that encrypts with the key whose ID is active and decrypts with
// any of keys.
func New(active string, keys ...Key) (*Codec, error) {
	if len(keys) == 0 {
		return nil, errors.New("codec: no keys")
	}
	c := &Codec{active: active, aeads: map[string]cipher.AEAD{}}
	for _, k := range keys {
		if !KeyIDPattern.MatchString(k.ID) {
			return nil, fmt.Errorf("codec: key ID must match %s, got %q", KeyIDPattern, k.ID)
		}
		if _, dup := c.aeads[k.ID]; dup {
			return nil, fmt.Errorf("codec: key ID %q given twice", k.ID)
		}
		if len(k.Secret) != KeySize {
			return nil, fmt.Errorf("codec: key %q has %d bytes, want %d", k.ID, len(k.Secret), KeySize)
		}
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("codec: key %q: %w", k.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("codec: key %q: %w", k.ID, err)
		}
		c.aeads[k.ID] = aead
		c.ids = append(c.ids, k.ID)
	}
	slices.Sort(c.ids)
	if _, ok := c.aeads[active]; !ok {
		return nil, fmt.Errorf("codec: active key %q is not among the keys (%s)", active, strings.Join(c.ids, ", "))
	}
	return c, nil
}

// ActiveKeyID returns the ID of the key that encrypts.
func (c *Codec) ActiveKeyID() string { return c.active }

// KeyIDs returns the IDs of all keys, sorted.
func (c *Codec) KeyIDs() []string { return slices.Clone(c.ids) }

// Encode encrypts each payload, metadata and data together, with the active key. The
// key ID is the additional authenticated data, so a payload cannot be passed off as
// encrypted with another key.
func (c *Codec) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	aead := c.aeads[c.active]
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		plain, err := proto.Marshal(p)
		if err != nil {
			return payloads, fmt.Errorf("codec: marshal payload: %w", err)
		}
		nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
		if _, err := rand.Read(nonce); err != nil {
			return payloads, fmt.Errorf("codec: nonce: %w", err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{
				MetadataEncoding: []byte(EncodingEncrypted),
				MetadataKeyID:    []byte(c.active),
			},
			Data: aead.Seal(nonce, nonce, plain, []byte(c.active)),
		}
	}
	return out, nil
}

// Decode decrypts the payloads that Encode encrypted, with the key their metadata names,
// and passes others through unchanged (payloads written before the codec was turned on).
func (c *Codec) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if string(p.GetMetadata()[MetadataEncoding]) != EncodingEncrypted {
			out[i] = p
			continue
		}
		id := string(p.GetMetadata()[MetadataKeyID])
		aead, ok := c.aeads[id]
		if !ok {
			return payloads, fmt.Errorf("codec: payload was encrypted with key %q, which is not configured (configured: %s)", id, strings.Join(c.ids, ", "))
		}
		data := p.GetData()
		if len(data) < aead.NonceSize()+aead.Overhead() {
			return payloads, fmt.Errorf("codec: payload encrypted with key %q is truncated (%d bytes)", id, len(data))
		}
		plain, err := aead.Open(nil, data[:aead.NonceSize()], data[aead.NonceSize():], []byte(id))
		if err != nil {
			return payloads, fmt.Errorf("codec: payload encrypted with key %q failed authentication: it was altered, or the key with that ID is not the one that encrypted it", id)
		}
		var decoded commonpb.Payload
		if err := proto.Unmarshal(plain, &decoded); err != nil {
			return payloads, fmt.Errorf("codec: unmarshal payload decrypted with key %q: %w", id, err)
		}
		out[i] = &decoded
	}
	return out, nil
}

// DataConverter returns the SDK's default data converter with c applied to every
// payload.
func DataConverter(c converter.PayloadCodec) converter.DataConverter {
	return converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), c)
}

// FailureConverter returns a failure converter that moves failure messages and stack
// traces into an encoded attribute, so that they too are encrypted by dc's codec. Use it
// with dc = [DataConverter](c).
//
// It reads a failure from a copy: the SDK's converter decodes the encoded attributes in
// place, and a local activity's failure is read from the very marker command the worker
// then sends, which would put the message back in plaintext into the history.
func FailureConverter(dc converter.DataConverter) converter.FailureConverter {
	return copyingFailureConverter{temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{DataConverter: dc, EncodeCommonAttributes: true})}
}

// copyingFailureConverter converts failures to errors from a copy, leaving the failure it
// was given as it was.
type copyingFailureConverter struct {
	converter.FailureConverter
}

func (c copyingFailureConverter) FailureToError(f *failurepb.Failure) error {
	if f == nil {
		return nil
	}
	return c.FailureConverter.FailureToError(proto.Clone(f).(*failurepb.Failure))
}

// maxRequestBytes bounds one request to the HTTP handler (Temporal payloads are below
// 2 MB; a request may carry several).
const maxRequestBytes = 16 << 20

// NewHTTPHandler serves c as a remote codec at /encode and /decode (POST, JSON payloads,
// as the Temporal Web UI and CLI call it), allowing cross-origin requests from the
// origins given (the UI's, e.g. http://127.0.0.1:8233). The UI sends its namespace in
// X-Namespace and may send credentials. A request from another origin is refused (403)
// before anything is decoded: withholding the CORS headers alone would not stop a page
// that a DNS rebinding makes look same-origin to the browser, which still names its own
// origin. Requests without an Origin (the Temporal CLI's, curl's) are served.
func NewHTTPHandler(c converter.PayloadCodec, origins ...string) http.Handler {
	inner := converter.NewPayloadCodecHTTPHandler(c)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin != "" && !slices.Contains(origins, origin) {
			http.Error(w, fmt.Sprintf("origin %q is not allowed (outbox codec-server --origin)", origin), http.StatusForbidden)
			return
		}
		if origin != "" {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Set("Access-Control-Allow-Methods", "POST, OPTIONS")
			h.Set("Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization")
			h.Add("Vary", "Origin")
		}
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusOK)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBytes)
		inner.ServeHTTP(w, r)
	})
}
