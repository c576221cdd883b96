package teamnexus

import (
	"context"
	"errors"

	"github.com/nexus-rpc/sdk-go/nexus"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks"
)

// OperationError returns a handler's error as the failed operation the delivery workflow
// reads: the operation fails (so the Nexus machinery does not retry it behind the
// workflow's back: each attempt is one operation), with the handler's error as
// sinks.ApplicationError reports it as its cause (its kind as the type, its
// RetryAfter as the NextRetryDelay). nil stays nil.
func OperationError(err error) error {
	if err == nil {
		return nil
	}
	return &nexus.OperationError{State: nexus.OperationStateFailed, Message: err.Error(), Cause: sinks.ApplicationError(err)}
}

// Operation returns h as the synchronous operation name of a team's Nexus service, for a
// topic configured with nexus: {endpoint, service, operation: name}: its errors reach the
// delivery workflow as OperationError reports them. The operation must end within the
// topic's timeout; a handler that starts longer work starts a workflow of its own.
//
//	svc := nexus.NewService("orders")
//	_ = svc.Register(teamnexus.Operation("deliver", h), teamnexus.CheckOperation("delivered", h))
//	w.RegisterNexusService(svc)
func Operation(name string, h delivery.Handler) nexus.Operation[delivery.Message, nexus.NoValue] {
	return nexus.NewSyncOperation(name, func(ctx context.Context, m delivery.Message, _ nexus.StartOperationOptions) (nexus.NoValue, error) {
		return nil, OperationError(h.Send(ctx, m))
	})
}

// CheckOperation returns c as the check_operation name of such a topic. A Checker that
// returns ErrCheckUnsupported answers "not processed", so the message is sent again; a
// Checker that cannot answer fails the operation, and the message is sent again too.
func CheckOperation(name string, c delivery.Checker) nexus.Operation[delivery.Message, bool] {
	return nexus.NewSyncOperation(name, func(ctx context.Context, m delivery.Message, _ nexus.StartOperationOptions) (bool, error) {
		processed, err := c.CheckProcessed(ctx, m)
		switch {
		case errors.Is(err, delivery.ErrCheckUnsupported):
			return false, nil
		case err != nil:
			return false, OperationError(delivery.Ambiguous(err))
		}
		return processed, nil
	})
}
