package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	failurepb "go.temporal.io/api/failure/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/server/temporaltest"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/codec"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// newCodecClient returns a client of ts whose payloads and failure messages go through
// the codec configured in cfg, as `outbox worker` and `outbox relay` build it.
func newCodecClient(t *testing.T, ts *temporaltest.TestServer, cfg *config.Config) client.Client {
	t.Helper()
	c, err := cfg.Codec.New()
	require.NoError(t, err)
	require.NotNil(t, c)
	opts, err := temporalx.ClientOptions(temporalx.Options{Namespace: ts.GetDefaultNamespace(), Codec: c})
	require.NoError(t, err)
	return ts.NewClientWithOptions(opts)
}

// historyPayloads returns the payloads and failures in the raw history of a workflow,
// leaving out search attributes, memos and headers (which the codec does not cover).
func historyPayloads(t *testing.T, c client.Client, workflowID string) ([]*commonpb.Payload, []*failurepb.Failure) {
	t.Helper()
	var (
		payloads []*commonpb.Payload
		failures []*failurepb.Failure
		walk     func(m protoreflect.Message)
	)
	walk = func(m protoreflect.Message) {
		switch v := m.Interface().(type) {
		case *commonpb.Payload:
			payloads = append(payloads, v)
			return
		case *failurepb.Failure:
			failures = append(failures, v)
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch fd.Name() {
			case "search_attributes", "memo", "header":
				return true
			}
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { walk(mv.Message()); return true })
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	it := c.GetWorkflowHistory(context.Background(), workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		walk(ev.ProtoReflect())
	}
	return payloads, failures
}

func TestCodec(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()

	secret := make([]byte, codec.KeySize)
	_, err := rand.Read(secret)
	require.NoError(t, err)
	keyFile := filepath.Join(t.TempDir(), "k1.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(secret)), 0o600))
	codecCfg := &config.Config{Codec: config.Codec{Keys: []config.CodecKey{{ID: "k1", KeyFile: keyFile}}, Active: "k1"}}

	// The codec server, as `outbox codec-server` runs it.
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte("codec:\n  keys:\n    - id: k1\n      key_file: "+keyFile+"\n  active: k1\n"), 0o600))
	srv := startOutbox(t, "", nil, "codec-server", "--config", cfgPath, "--addr", "127.0.0.1:0")
	out := srv.out
	t.Cleanup(func() {
		code, exited := srv.interrupt(30 * time.Second)
		require.True(t, exited, "outbox codec-server did not stop within 30s:\n%s", out)
		require.Equal(t, 0, code, out.String()) // 0: ok
	})
	addrRE := regexp.MustCompile(`codec server on (http://\S+)`)
	var codecURL string
	require.Eventually(t, func() bool {
		m := addrRE.FindStringSubmatch(out.String())
		if m != nil {
			codecURL = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, out.String())
	decode := func(t *testing.T, ps []*commonpb.Payload) []*commonpb.Payload {
		body, err := protojson.Marshal(&commonpb.Payloads{Payloads: ps})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, codecURL+"/decode", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Origin", "http://127.0.0.1:8233")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(data))
		require.Equal(t, "http://127.0.0.1:8233", resp.Header.Get("Access-Control-Allow-Origin"))
		var decoded commonpb.Payloads
		require.NoError(t, protojson.Unmarshal(data, &decoded))
		return decoded.Payloads
	}

	e := newEnv(t, ts)
	e.client = newCodecClient(t, ts, codecCfg)
	e.startWorker(t)
	e.startRelay(t)

	t.Run("DeliveryHistoryIsCiphertext", func(t *testing.T) {
		marker := "plaintext-marker-" + uuid.NewString()
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`{"note": "` + marker + `"}`)})
		require.NoError(t, err)
		e.waitStatus(t, id, store.StatusSent)
		requests, _ := e.recv.Count(id.String())
		require.Equal(t, 1, requests)

		// The raw history, read without the codec.
		payloads, _ := historyPayloads(t, ts.GetDefaultClient(), workflows.WorkflowID(id.String()))
		require.NotEmpty(t, payloads)
		var inputs []*commonpb.Payload
		for _, p := range payloads {
			require.Equal(t, codec.EncodingEncrypted, string(p.GetMetadata()[codec.MetadataEncoding]), "payload %v", p)
			require.Equal(t, "k1", string(p.GetMetadata()[codec.MetadataKeyID]))
			require.NotContains(t, string(p.GetData()), id.String())
			require.NotContains(t, string(p.GetData()), marker)
			inputs = append(inputs, p)
		}

		// The codec server turns them back into plaintext, as the UI shows them.
		decoded := decode(t, inputs)
		var all strings.Builder
		for _, p := range decoded {
			require.NotEqual(t, codec.EncodingEncrypted, string(p.GetMetadata()[codec.MetadataEncoding]))
			all.Write(p.GetData())
		}
		require.Contains(t, all.String(), id.String(), "the workflow input names the message")
	})

	t.Run("FailureMessagesAreCiphertext", func(t *testing.T) {
		e.recv.SetStatus("order.failing", http.StatusBadRequest)
		id := e.enqueueOrderPlain(t, "order.failing", nil)
		e.waitStatus(t, id, store.StatusDead)
		dls, err := e.store.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Contains(t, dls[0].LastError, "HTTP 400", "the row keeps the readable error")

		_, failures := historyPayloads(t, ts.GetDefaultClient(), workflows.WorkflowID(id.String()))
		require.NotEmpty(t, failures)
		var encoded []*commonpb.Payload
		for _, f := range failures {
			require.NotContains(t, f.GetMessage(), "400")
			require.Empty(t, f.GetStackTrace())
			if f.GetEncodedAttributes() != nil {
				encoded = append(encoded, f.GetEncodedAttributes())
			}
		}
		require.NotEmpty(t, encoded)
		var all strings.Builder
		for _, p := range decode(t, encoded) {
			all.Write(p.GetData())
		}
		require.Contains(t, all.String(), "HTTP 400")

		// A client with the codec reads the failure in plaintext.
		err = e.client.GetWorkflow(ctx, workflows.WorkflowID(id.String()), "").Get(ctx, nil)
		require.Error(t, err)
		require.Contains(t, err.Error(), workflows.ErrTypeDeadLettered)
	})

	// The retention schedule's argument is ciphertext too. A worker reads the schedule in
	// place through its codec, so one started again with the same settings finds it as it
	// should be and sends no update; the SDK's default converter could not read it.
	t.Run("RetentionScheduleIsReadThroughTheCodec", func(t *testing.T) {
		cfg := e.retentionConfig(ts, config.Retention{Interval: config.Duration(time.Hour)})
		cfg.Codec = codecCfg.Codec
		a, err := app.Open(ctx, cfg, app.Options{Logger: logger})
		require.NoError(t, err)
		t.Cleanup(a.Close)
		require.NoError(t, a.DialTemporal(ctx))
		updates := &countingScheduleClient{ScheduleClient: a.Temporal.ScheduleClient()}
		a.Temporal = scheduleClientOf{Client: a.Temporal, schedules: updates}

		require.NoError(t, a.EnsureRetentionSchedule(ctx))
		require.Zero(t, updates.calls.Load(), "created")
		args := describeRetention(t, ts.GetDefaultClient(), e.taskQueue).Schedule.Action.(*client.ScheduleWorkflowAction).Args
		require.Len(t, args, 1)
		p := args[0].(*commonpb.Payload)
		require.Equal(t, codec.EncodingEncrypted, string(p.GetMetadata()[codec.MetadataEncoding]))

		require.NoError(t, a.EnsureRetentionSchedule(ctx))
		require.Equal(t, int32(1), updates.calls.Load(), "the second call looked at the schedule")
		require.Zero(t, updates.sent.Load(), "and sent no update")

		in := a.Config.Retention.WorkflowInput()
		require.NoError(t, worker.EnsureRetentionSchedule(ctx, a.Temporal, a.Config.Temporal.TaskQueue, in, time.Hour))
		require.Equal(t, int32(1), updates.sent.Load(), "read with the default converter, the argument counts as changed")
		require.NoError(t, worker.EnsureRetentionScheduleConverter(ctx, a.Temporal, codecClientConverter(t, codecCfg), a.Config.Temporal.TaskQueue, in, time.Hour))
		require.Equal(t, int32(1), updates.sent.Load(), "and read with the codec's, as it is")
	})
}

// codecClientConverter returns the data converter of a client with cfg's codec.
func codecClientConverter(t *testing.T, cfg *config.Config) converter.DataConverter {
	t.Helper()
	c, err := cfg.Codec.New()
	require.NoError(t, err)
	return codec.DataConverter(c)
}
