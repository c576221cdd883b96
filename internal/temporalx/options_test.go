package temporalx

import (
	"context"
	"crypto/tls"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/codec"
)

func TestClientOptions(t *testing.T) {
	t.Parallel()
	plain, err := ClientOptions(Options{Address: "a:7233", Namespace: "ns"})
	require.NoError(t, err)
	require.Nil(t, plain.ConnectionOptions.TLS)
	require.Nil(t, plain.Credentials)
	require.Nil(t, plain.DataConverter)

	c, err := codec.New("k1", codec.Key{ID: "k1", Secret: make([]byte, codec.KeySize)})
	require.NoError(t, err)
	o := Options{Address: "a:7233", Namespace: "ns", TLS: &tls.Config{ServerName: "x"}, APIKey: "SECRET-API-KEY", Codec: c}
	secured, err := ClientOptions(o)
	require.NoError(t, err)
	require.Equal(t, "x", secured.ConnectionOptions.TLS.ServerName)
	require.NotNil(t, secured.Credentials)
	p, err := secured.DataConverter.ToPayload("message")
	require.NoError(t, err)
	require.Equal(t, codec.EncodingEncrypted, string(p.Metadata[codec.MetadataEncoding]))
	require.NotNil(t, secured.FailureConverter)
	require.NotContains(t, o.String(), "SECRET-API-KEY")

	_, err = ClientOptions(Options{TLS: &tls.Config{}, TLSDisabled: true})
	require.ErrorContains(t, err, "both configured and disabled")

	off, err := ClientOptions(Options{APIKey: "k", TLSDisabled: true})
	require.NoError(t, err)
	require.True(t, off.ConnectionOptions.TLSDisabled)

	headers := map[string]string{"x-tenant": "orders"}
	routed, err := ClientOptions(Options{Headers: headers, Authority: "frontend.internal"})
	require.NoError(t, err)
	require.Equal(t, "frontend.internal", routed.ConnectionOptions.Authority)
	got, err := routed.HeadersProvider.GetHeaders(context.Background())
	require.NoError(t, err)
	require.Equal(t, headers, got)
	require.Nil(t, plain.HeadersProvider, "no headers, no provider")
}
