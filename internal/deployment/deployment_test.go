package deployment

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outbox-go/outbox/workflows"
)

type pollers map[enumspb.TaskQueueType][]*taskqueuepb.PollerInfo

func (p pollers) DescribeTaskQueue(_ context.Context, _ string, t enumspb.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error) {
	return &workflowservice.DescribeTaskQueueResponse{Pollers: p[t]}, nil
}

func TestIdentity(t *testing.T) {
	id := uuid.New()
	ident := Identity("", id)
	require.True(t, strings.HasSuffix(ident, "@outbox:"+id.String()), ident)
	got, ok := FromIdentity(ident)
	require.True(t, ok)
	require.Equal(t, id, got)
	_, ok = FromIdentity("123@host@outbox")
	require.False(t, ok, "the SDK's default identity names the task queue, not a deployment")

	v, ok := VersionFromIdentity(ident)
	require.True(t, ok)
	require.Equal(t, workflows.DeliveryVersion, v)
	v, ok = VersionFromIdentity("1@a@outbox:" + id.String())
	require.True(t, ok)
	require.Equal(t, 3, v, "an outbox worker that names no version runs version 3")
	_, ok = VersionFromIdentity("1@a")
	require.False(t, ok)
}

func TestDeliveryVersion(t *testing.T) {
	ctx := context.Background()
	own, other := uuid.New(), uuid.New()
	now := timestamppb.Now()
	poller := func(ident string, at *timestamppb.Timestamp) *taskqueuepb.PollerInfo {
		return &taskqueuepb.PollerInfo{Identity: ident, LastAccessTime: at}
	}
	version := func(p pollers) int {
		v, _, err := DeliveryVersion(ctx, p, "outbox", own, 4)
		require.NoError(t, err)
		return v
	}
	require.Equal(t, 4, version(pollers{}), "no worker polls: the newest")
	require.Equal(t, 4, version(pollers{enumspb.TASK_QUEUE_TYPE_WORKFLOW: {poller("1@a@delivery-v4@outbox:"+own.String(), now)}}))
	require.Equal(t, 3, version(pollers{enumspb.TASK_QUEUE_TYPE_WORKFLOW: {
		poller("1@a@delivery-v4@outbox:"+own.String(), now), poller("2@b@outbox:"+own.String(), now)}}), "an older worker of its own deployment holds it back")
	require.Equal(t, 4, version(pollers{enumspb.TASK_QUEUE_TYPE_WORKFLOW: {
		poller("2@b@outbox:"+own.String(), timestamppb.New(time.Now().Add(-10*time.Minute))),
		poller("3@c@outbox:"+other.String(), now), poller("4@d", now)}}), "stopped, other deployments' and teams' pollers do not count")
	require.Equal(t, 4, version(pollers{enumspb.TASK_QUEUE_TYPE_WORKFLOW: {poller("1@a@delivery-v5@outbox:"+own.String(), now)}}), "at most the newest this relay knows")
}

func TestCheckTaskQueue(t *testing.T) {
	ctx := context.Background()
	own, other := uuid.New(), uuid.New()
	now := timestamppb.Now()
	poller := func(ident string, at *timestamppb.Timestamp) *taskqueuepb.PollerInfo {
		return &taskqueuepb.PollerInfo{Identity: ident, LastAccessTime: at}
	}

	require.NoError(t, CheckTaskQueue(ctx, pollers{}, "outbox", own))
	require.NoError(t, CheckTaskQueue(ctx, pollers{
		enumspb.TASK_QUEUE_TYPE_WORKFLOW: {poller(Identity("1@a", own), now), poller("2@b@outbox", now)},
	}, "outbox", own), "its own deployment and pollers without an outbox identity pass")
	require.NoError(t, CheckTaskQueue(ctx, pollers{
		enumspb.TASK_QUEUE_TYPE_WORKFLOW: {poller(Identity("1@a", other), timestamppb.New(time.Now().Add(-10*time.Minute)))},
	}, "outbox", own), "a poller that stopped minutes ago is not running")

	err := CheckTaskQueue(ctx, pollers{
		enumspb.TASK_QUEUE_TYPE_ACTIVITY: {poller(Identity("3@c", other), now)},
	}, "outbox", own)
	var conflict *ConflictError
	require.True(t, errors.As(err, &conflict))
	require.Equal(t, other, conflict.Other)
	require.Contains(t, err.Error(), "task queue outbox")
	require.Contains(t, err.Error(), other.String())
	require.Contains(t, err.Error(), "a task queue belongs to one outbox database")
}
