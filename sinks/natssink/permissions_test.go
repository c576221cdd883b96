package natssink_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/natssink"
)

// natsServer starts a private NATS server with JetStream and the given accounts block, on
// a free port, and returns its URL; it is stopped when the test ends.
func natsServer(t *testing.T, accounts string) string {
	t.Helper()
	url, _ := natsServerReloadable(t, accounts)
	return url
}

// natsServerReloadable is natsServer, and a function that replaces the server's accounts
// block and has the server reload its configuration (SIGHUP).
func natsServerReloadable(t *testing.T, accounts string) (url string, reload func(accounts string)) {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("nats-server is not installed (scripts/services.sh installs it): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	write := func(accounts string) {
		require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n%s\n",
			port, filepath.Join(dir, "js"), accounts)), 0o600))
	}
	write(accounts)
	cmd := exec.Command(bin, "-c", conf)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "nats-server on %s", addr)
	return "nats://" + addr, func(accounts string) {
		write(accounts)
		require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	}
}

// A user the server does not let publish to the topic's subject: the server refuses each
// publish, so the send is a permanent failure that names the permission, not a timeout
// read as ambiguous on every attempt.
func TestPublishPermissionViolationIsPermanent(t *testing.T) {
	t.Parallel()
	url := natsServer(t, accountsWith(`{ user: limited, password: limited, permissions: { publish: { deny: ["orders.>"] } } }`))
	ordersStream(t, url)
	ctx := context.Background()

	s := newSink(t, natssink.Config{URL: url, Subject: "orders.{topic}", Username: "limited", Password: "limited"})
	require.NoError(t, s.Open(ctx))
	// The refusal comes on the connection, not as the publish's answer; it ends the send,
	// which does not wait for its attempt's end.
	sendCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := s.Send(sendCtx, message("created", ""))
	require.Error(t, err)
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "permission")
	require.ErrorContains(t, err, "orders.created")
	require.NoError(t, sendCtx.Err(), "the send waited for its attempt to end")

	// The batch publish's messages alike.
	requireBatchFailsAtOnce(t, s, delivery.IsPermanent, "permission")
}

// requireBatchFailsAtOnce publishes a batch of two messages with s and requires each to
// fail with an error of the kind is tells, containing text, before the attempt ends.
func requireBatchFailsAtOnce(t *testing.T, s *natssink.Sink, is func(error) bool, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, err := range s.SendBatch(ctx, []delivery.Message{message("created", ""), message("created", "")}) {
		require.True(t, is(err), "%v", err)
		require.ErrorContains(t, err, text)
	}
	require.NoError(t, ctx.Err(), "the batch waited for its attempt to end")
}

// A server whose connects hang (it accepts and never says hello): concurrent sends each
// give up by their own deadline, as not sent, instead of waiting in turn for one connect
// after another.
func TestConnectsThatHangEndWithEachSendsDeadline(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu       sync.Mutex
		accepted []net.Conn
	)
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range accepted {
			_ = c.Close()
		}
	})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
		}
	}()
	s := newSink(t, natssink.Config{URL: "nats://" + l.Addr().String(), Subject: "orders.{topic}"})
	const sends, deadline = 4, time.Second
	type result struct {
		err  error
		took time.Duration
	}
	results := make(chan result, sends)
	for range sends {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			began := time.Now()
			err := s.Send(ctx, message("created", ""))
			results <- result{err, time.Since(began)}
		}()
	}
	for range sends {
		r := <-results
		require.Error(t, r.err)
		_, retryable := delivery.IsRetryable(r.err)
		require.True(t, retryable, "a connect that never completed sent nothing: %v", r.err)
		// One connect at a time, each within the caller's deadline: every send ends near its
		// own deadline (a margin for a busy machine), not after the connects of the sends
		// before it (2 s each, the client's own timeout).
		require.Less(t, r.took, 3*deadline, "%v", r.err)
	}
}

// A user the server does not let subscribe to the reply inbox: the publish goes out and
// the stream stores it, but no acknowledgement can come back. The send ends at once as
// ambiguous (the stream may have the message; a resend is absorbed by its duplicate
// window), with an error that names the permission, not a timeout at the end of every
// attempt. Once the permission is granted, the next send gets its acknowledgement: the
// connection whose inbox was refused is replaced.
func TestReplyInboxPermissionViolationIsNamed(t *testing.T) {
	t.Parallel()
	limited := `{ user: limited, password: limited, permissions: { subscribe: { deny: ["_INBOX.>"] } } }`
	url, reload := natsServerReloadable(t, accountsWith(limited))
	stream := ordersStream(t, url)
	ctx := context.Background()

	s := newSink(t, natssink.Config{URL: url, Subject: "orders.{topic}", Username: "limited", Password: "limited"})
	require.NoError(t, s.Open(ctx))
	for range 2 {
		sendCtx, cancel := context.WithTimeout(ctx, time.Minute)
		m := message("created", "")
		err := s.Send(sendCtx, m)
		require.Error(t, err)
		require.True(t, delivery.IsAmbiguous(err), "%v", err)
		require.ErrorContains(t, err, "reply inbox")
		require.ErrorContains(t, err, "_INBOX.>")
		require.NoError(t, sendCtx.Err(), "the send waited for its attempt to end")
		cancel()
		stored, err := stream.GetLastMsgForSubject(ctx, "orders.created")
		require.NoError(t, err)
		require.Equal(t, m.MessageID, stored.Header.Get(jetstream.MsgIDHeader), "the stream has the message")
	}
	requireBatchFailsAtOnce(t, s, delivery.IsAmbiguous, "reply inbox")

	// The permission granted: the next sends are acknowledged.
	reload(accountsWith(`{ user: limited, password: limited }`))
	require.Eventually(t, func() bool {
		sendCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return s.Send(sendCtx, message("created", "")) == nil
	}, 30*time.Second, 100*time.Millisecond)
}

// ordersStream creates, as the admin user, the stream ORDERS of the subjects orders.>.
func ordersStream(t *testing.T, url string) jetstream.Stream {
	t.Helper()
	admin, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	require.NoError(t, err)
	stream, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	require.NoError(t, err)
	return stream
}

// accountsWith is an accounts block with an admin user and the given one.
func accountsWith(user string) string {
	return `accounts {
  APP {
    jetstream: enabled
    users: [
      { user: admin, password: admin }
      ` + user + `
    ]
  }
}`
}
