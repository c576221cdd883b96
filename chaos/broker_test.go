//go:build linux

package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testutil"
)

// natsServer is a NATS server with JetStream of the fault's own, on its port and store
// folder (which survive a restart).
type natsServer struct {
	e    *chaosEnv
	port int
	dir  string
	proc *proc
	runs int
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

func (n *natsServer) start() error {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
	}
	n.runs++
	p, err := startProc(procSpec{
		name: "nats", path: bin, args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-js", "-sd", n.dir},
		dir: n.e.base, logPath: filepath.Join(n.e.base, fmt.Sprintf("nats-%d.log", n.runs)),
		ready: "Server is ready", within: 30 * time.Second,
	})
	if err != nil {
		return err
	}
	n.proc = p
	return nil
}

// restart stops the server (SIGTERM, as an operator's restart does), waits pause and
// starts it again; it returns how long the server was down.
func (n *natsServer) restart(pause time.Duration) (time.Duration, error) {
	start := time.Now()
	n.proc.stop(syscall.SIGTERM, 30*time.Second)
	time.Sleep(pause)
	err := n.start()
	return time.Since(start), err
}

// snapshot reads the stream and tells, per message ID, how often it holds the message.
func (n *natsServer) snapshot(stream string) testutil.Snapshot {
	s := testutil.Snapshot{Requests: map[string]int{}, Attempts: map[string][]int{}, Effects: map[string]bool{}, Redelivered: map[string]int{}}
	nc, err := nats.Connect(n.url())
	if err != nil {
		s.Bad = append(s.Bad, "connect: "+err.Error())
		return s
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		err = readStream(js, stream, func(m jetstream.Msg) {
			s.Total++
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if id == "" {
				s.Bad = append(s.Bad, m.Subject())
				return
			}
			s.Requests[id]++
			if s.Effects[id] {
				s.Redelivered[id]++
			}
			s.Effects[id] = true
		})
	}
	if err != nil {
		s.Bad = append(s.Bad, "read the stream: "+err.Error())
	}
	return s
}

func readStream(js jetstream.JetStream, stream string, each func(jetstream.Msg)) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(int(min(info.State.Msgs-read, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			each(m)
			got++
		}
		if got == 0 {
			return fmt.Errorf("read %d of %d messages", read, info.State.Msgs)
		}
		read += uint64(got)
	}
	return nil
}

// TestBrokerRestart delivers the healthy topic to a NATS JetStream stream, under the
// default delivery policy, and restarts the NATS server for 5s half way: every message
// ends sent and in the stream, and none twice (a publish in doubt when the server went
// away is sent again with the same Nats-Msg-Id, which the stream's duplicate window
// absorbs).
func TestBrokerRestart(t *testing.T) {
	srv := &natsServer{port: testutil.FreePorts(t, 1)[0]}
	const stream = "CHAOS"
	sink := fmt.Sprintf("    sink: nats\n    url: nats://127.0.0.1:%d\n    subject: chaos.{topic}\n", srv.port)
	e := newEnvSink(t, sink, "", "", func(e *chaosEnv) {
		srv.e, srv.dir = e, filepath.Join(e.base, "nats")
		require.NoError(t, srv.start())
		t.Cleanup(func() { srv.proc.stop(syscall.SIGTERM, 30*time.Second) })
		nc, err := nats.Connect(srv.url())
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		_, err = testutil.CreateStream(context.Background(), js, jetstream.StreamConfig{Name: stream, Subjects: []string{"chaos.>"}})
		require.NoError(t, err)
		e.downstream = func() testutil.Snapshot { return srv.snapshot(stream) }
	})
	n := messagesPerFault(t)
	runFault(t, e, "broker-restart", n, true, func(l *loader) {
		target := int64(n / 2)
		if !waitFor(2*time.Minute, func() bool { return l.done.Load() >= target }) {
			t.Errorf("the loader never reached %d commits", target)
			return
		}
		down, err := srv.restart(5 * time.Second)
		if err != nil {
			t.Errorf("restart NATS: %v", err)
			return
		}
		t.Logf("NATS restarted at %d commits; down for %s", l.done.Load(), down.Round(time.Millisecond))
	})
	var retried int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE retry_times > 0`).Scan(&retried))
	t.Logf("%d messages needed more than one publish", retried)
	require.NotZero(t, retried, "no publish met the outage")
}
