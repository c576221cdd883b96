// Package deployment tells the outbox workers of one deployment (one outbox database, see
// store.Store.Deployment) from those of another on a Temporal task queue: a worker's
// identity carries its deployment ID, and CheckTaskQueue looks for pollers of another
// deployment before a worker or a relay starts.
package deployment

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/outbox-go/outbox/workflows"
)

// identityMark precedes the deployment ID in a worker's identity.
const identityMark = "@outbox:"

// versionMark precedes, in a worker's identity, the newest OutboxDelivery version it runs
// (workflows.DeliveryVersion).
const versionMark = "@delivery-v"

// unnamedVersion is the OutboxDelivery version of a worker whose outbox identity names
// none: workers named their version from DeliveryVersion 4 on.
const unnamedVersion = 3

// Identity returns the worker identity of a worker of deployment id: base (the SDK's
// default form, <pid>@<host>, when empty) followed by @delivery-v<version>@outbox:<id>,
// where version is the newest OutboxDelivery version this code runs.
func Identity(base string, id uuid.UUID) string {
	if base == "" {
		host, _ := os.Hostname()
		base = fmt.Sprintf("%d@%s", os.Getpid(), host)
	}
	return fmt.Sprintf("%s%s%d%s%s", base, versionMark, workflows.DeliveryVersion, identityMark, id)
}

// VersionFromIdentity returns the newest OutboxDelivery version a worker of identity runs:
// the one it names, or 3 for an outbox identity that names none (a worker from before
// identities named it). ok is false for an identity Identity did not make.
func VersionFromIdentity(identity string) (version int, ok bool) {
	i := strings.LastIndex(identity, identityMark)
	if i < 0 {
		return 0, false
	}
	head := identity[:i]
	j := strings.LastIndex(head, versionMark)
	if j < 0 {
		return unnamedVersion, true
	}
	v, err := strconv.Atoi(head[j+len(versionMark):])
	if err != nil || v < 1 {
		return unnamedVersion, true
	}
	return v, true
}

// DeliveryVersion returns the OutboxDelivery version a relay of deployment own may start
// on taskQueue: the newest that every outbox worker of own polling its workflow tasks
// (within ActiveWindow) runs, at most newest. With no such worker polling it is newest:
// workers are upgraded before relays. Pollers of other deployments, and those without an
// outbox identity (a team's own worker), are not counted.
//
// A run must be started at a version every worker that may take its tasks runs: a worker
// of an older version would run the first workflow task the older way, and a newer one
// replaying that history later would find commands it does not give.
func DeliveryVersion(ctx context.Context, d Describer, taskQueue string, own uuid.UUID, newest int) (version int, oldest string, err error) {
	resp, err := d.DescribeTaskQueue(ctx, taskQueue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
	if err != nil {
		return newest, "", fmt.Errorf("describe task queue %s: %w", taskQueue, err)
	}
	version = newest
	for _, p := range resp.GetPollers() {
		if id, ok := FromIdentity(p.GetIdentity()); !ok || id != own {
			continue
		}
		if at := p.GetLastAccessTime(); at != nil && time.Since(at.AsTime()) > ActiveWindow {
			continue
		}
		if v, _ := VersionFromIdentity(p.GetIdentity()); v < version {
			version, oldest = v, p.GetIdentity()
		}
	}
	return version, oldest, nil
}

// FromIdentity returns the deployment ID in a worker identity made by Identity.
func FromIdentity(identity string) (uuid.UUID, bool) {
	i := strings.LastIndex(identity, identityMark)
	if i < 0 {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(identity[i+len(identityMark):])
	return id, err == nil
}

// ActiveWindow is how recently a poller must have polled to count as running. A worker
// long-polls for up to about a minute at a time, and the server lists a poller for some
// minutes after it stopped.
const ActiveWindow = 2 * time.Minute

// Describer is the part of client.Client that CheckTaskQueue uses.
type Describer interface {
	DescribeTaskQueue(ctx context.Context, taskQueue string, taskQueueType enumspb.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error)
}

// ConflictError says that workers of another outbox deployment poll the task queue.
type ConflictError struct {
	TaskQueue string
	Own       uuid.UUID
	Other     uuid.UUID
	Identity  string // the other deployment's poller
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("task queue %s is polled by worker %s of outbox deployment %s, and this outbox is deployment %s: "+
		"a task queue belongs to one outbox database (each worker would take the other's messages, which its database does not hold); "+
		"give this outbox a task queue of its own (temporal.task_queue or OUTBOX_TASK_QUEUE, then outbox migrate --move-task-queue), "+
		"or stop the other deployment's workers (a stopped poller stops counting within %s)",
		e.TaskQueue, e.Identity, e.Other, e.Own, ActiveWindow)
}

// CheckTaskQueue looks at the workflow and activity pollers of taskQueue, and returns a
// *ConflictError when an outbox worker of a deployment other than own has polled it within
// ActiveWindow. A poller without an outbox identity (a worker of an older outbox, or a
// team's) is not judged. An error of the describe call itself is returned as is: the
// caller decides whether to start without the check.
func CheckTaskQueue(ctx context.Context, d Describer, taskQueue string, own uuid.UUID) error {
	for _, tqType := range []enumspb.TaskQueueType{enumspb.TASK_QUEUE_TYPE_WORKFLOW, enumspb.TASK_QUEUE_TYPE_ACTIVITY} {
		resp, err := d.DescribeTaskQueue(ctx, taskQueue, tqType)
		if err != nil {
			return fmt.Errorf("describe task queue %s: %w", taskQueue, err)
		}
		for _, p := range resp.GetPollers() {
			id, ok := FromIdentity(p.GetIdentity())
			if !ok || id == own {
				continue
			}
			if at := p.GetLastAccessTime(); at != nil && time.Since(at.AsTime()) > ActiveWindow {
				continue
			}
			return &ConflictError{TaskQueue: taskQueue, Own: own, Other: id, Identity: p.GetIdentity()}
		}
	}
	return nil
}

// TaskQueueError says that a relay or worker is configured with a task queue other than
// the one its outbox database recorded (store.Store.RecordTaskQueue).
type TaskQueueError struct {
	Schema     string
	Configured string
	Recorded   string
}

func (e *TaskQueueError) Error() string {
	return fmt.Sprintf("task queue %s is configured, but this outbox database (schema %s) records task queue %s: "+
		"a task queue belongs to one outbox database, and its workflows run on the recorded one; "+
		"configure temporal.task_queue: %s (or OUTBOX_TASK_QUEUE), or record %s with outbox migrate --move-task-queue "+
		"(Store.MoveTaskQueue) once no delivery runs on %s any more",
		e.Configured, e.Schema, e.Recorded, e.Recorded, e.Configured, e.Recorded)
}
