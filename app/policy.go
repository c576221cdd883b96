package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outbox-go/outbox/store/storedriver"
	"github.com/outbox-go/outbox/workflows"
)

// PolicyRefresh is how often a relay reads the published delivery policies back (so a
// policy another process published reaches the runs it starts within about this long),
// and how often a process whose own publication failed tries it again.
const PolicyRefresh = 5 * time.Second

// sharedPolicies are the delivery policies a relay freezes into the runs it starts when
// the config has a PolicyAsOf: the newest published ones (storedriver.PublishedPolicy),
// once this process has published its own or when they are newer than its own; its own
// until then.
type sharedPolicies struct {
	own    workflows.Policies
	ownDoc json.RawMessage
	asOf   time.Time // as the stores record it
	by     string
	driver storedriver.Delivery
	log    *slog.Logger

	published atomic.Bool
	inEffect  atomic.Pointer[publishedPolicies] // nil: own
}

// publishedPolicies is a publication and its policies.
type publishedPolicies struct {
	storedriver.PublishedPolicy
	policies workflows.Policies
}

// sharedPolicies returns the policies of the config shared through the database, or nil
// when the config has no PolicyAsOf. The first call makes them, for a process of role
// ("relay", "worker", or "relay and worker" from Run), and later calls return the same:
// a relay and a worker of one App publish once, under one name.
func (a *App) sharedPolicies(role string) (*sharedPolicies, error) {
	if a.Config.PolicyAsOf.IsZero() {
		return nil, nil
	}
	a.policiesMu.Lock()
	defer a.policiesMu.Unlock()
	if a.policies != nil {
		return a.policies, nil
	}
	own := a.Config.Policies()
	doc, err := json.Marshal(own)
	if err != nil {
		return nil, fmt.Errorf("delivery policies: %w", err)
	}
	host, _ := os.Hostname()
	by := fmt.Sprintf("%s %d@%s", role, os.Getpid(), host)
	if a.Config.Path != "" {
		by += ", " + a.Config.Path
	} else {
		by += ", environment"
	}
	if len(by) > storedriver.MaxPublishedBy {
		by = strings.ToValidUTF8(by[:storedriver.MaxPublishedBy-3], "") + "..."
	}
	a.policies = &sharedPolicies{own: own, ownDoc: doc, asOf: storedriver.PolicyTime(a.Config.PolicyAsOf), by: by,
		driver: a.driver(), log: a.log()}
	return a.policies, nil
}

// Policy returns topic's delivery policy as a relay freezes it into a run
// (starter.Config.Policy).
func (s *sharedPolicies) Policy(topic string) workflows.Policy {
	if p := s.inEffect.Load(); p != nil {
		return p.policies.For(topic)
	}
	return s.own.For(topic)
}

// sync publishes this process's policies unless it has, and takes the policies in effect
// when follow is set. It logs what changed.
func (s *sharedPolicies) sync(ctx context.Context, follow bool) error {
	var pub storedriver.PublishedPolicy
	var pubErr error
	if !s.published.Load() {
		if pub, pubErr = s.driver.PublishPolicy(ctx, storedriver.PublishedPolicy{Policies: s.ownDoc, AsOf: s.asOf, By: s.by}); pubErr == nil {
			s.published.Store(true)
			s.reportOwn(pub)
		}
	}
	if !follow {
		return pubErr
	}
	if pub.Policies == nil {
		var err error
		if pub, err = s.driver.PublishedPolicy(ctx); err != nil {
			return errors.Join(pubErr, err)
		}
	}
	if err := s.follow(pub); err != nil {
		return errors.Join(pubErr, err)
	}
	return pubErr
}

// follow takes pub as the policies in effect, unless this process has yet to publish its
// own and pub is not newer.
func (s *sharedPolicies) follow(pub storedriver.PublishedPolicy) error {
	if pub.Policies == nil {
		return nil
	}
	if !s.published.Load() && !pub.AsOf.After(s.asOf) {
		return nil // older than this process's, which it has yet to publish
	}
	if cur := s.inEffect.Load(); cur != nil && cur.AsOf.Equal(pub.AsOf) && cur.By == pub.By && cur.PublishedAt.Equal(pub.PublishedAt) {
		return nil
	}
	var p workflows.Policies
	if err := json.Unmarshal(pub.Policies, &p); err != nil {
		return fmt.Errorf("read the delivery policies %s published: %w", pub.By, err)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("the delivery policies %s published are not valid here (%w): the relay keeps the ones it has", pub.By, err)
	}
	prev := s.own
	if cur := s.inEffect.Load(); cur != nil {
		prev = cur.policies
	}
	s.inEffect.Store(&publishedPolicies{PublishedPolicy: pub, policies: p})
	if changed := p.Differ(prev); len(changed) > 0 {
		s.log.Info("The delivery policies in effect changed: new runs follow them", slog.String("published_by", pub.By),
			slog.Time("as_of", pub.AsOf), slog.String("topics", strings.Join(changed, ", ")))
	}
	return nil
}

// reportOwn warns when pub, the publication in effect after this process published its
// own, is another process's with other policies.
func (s *sharedPolicies) reportOwn(pub storedriver.PublishedPolicy) {
	if pub.By == s.by && pub.AsOf.Equal(s.asOf) {
		return
	}
	var p workflows.Policies
	if json.Unmarshal(pub.Policies, &p) != nil {
		return
	}
	if differ := s.own.Differ(p); len(differ) > 0 {
		s.log.Warn("This process's configuration is older than the delivery policies in effect: new runs follow those, not its own; "+
			"compare the files with outbox config check",
			slog.String("published_by", pub.By), slog.Time("as_of", pub.AsOf), slog.Time("own_as_of", s.asOf),
			slog.String("topics", strings.Join(differ, ", ")))
	}
}

// run calls sync every PolicyRefresh until ctx ends; without follow, only until this
// process has published its policies.
func (s *sharedPolicies) run(ctx context.Context, follow bool) {
	t := time.NewTicker(PolicyRefresh)
	defer t.Stop()
	failing := false
	for {
		if !follow && s.published.Load() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.sync(ctx, follow); err != nil && ctx.Err() == nil {
			if !failing {
				s.log.Warn("Sharing the delivery policies through the database failed: this process keeps the ones it has and tries again", slog.Any("error", err))
			}
			failing = true
		} else {
			failing = false
		}
	}
}

// start syncs once, warning when that fails, and goes on in the background until ctx ends.
func (s *sharedPolicies) start(ctx context.Context, follow bool) {
	if err := s.sync(ctx, follow); err != nil {
		s.log.Warn("Sharing the delivery policies through the database failed: this process keeps the ones it has (its own at first) "+
			"and tries again every "+PolicyRefresh.String()+"; a schema before migration 0014 needs outbox migrate",
			slog.Any("error", err))
	}
	go s.run(ctx, follow)
}
