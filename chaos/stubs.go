package main

import (
	"context"
	"errors"
)

var errTodo = errors.New("not implemented yet")

func scenarioRedelivery(ctx context.Context, s *suite, res *result) error      { return errTodo }
func scenarioKillLedger(ctx context.Context, s *suite, res *result) error      { return errTodo }
func scenarioKillProjector(ctx context.Context, s *suite, res *result) error   { return errTodo }
func scenarioPostgresRestart(ctx context.Context, s *suite, res *result) error { return errTodo }
func scenarioKillNATS(ctx context.Context, s *suite, res *result) error         { return errTodo }
func scenarioPartitions(ctx context.Context, s *suite, res *result) error       { return errTodo }
func scenarioCommitOrder(ctx context.Context, s *suite, res *result) error      { return errTodo }
func scenarioBadInput(ctx context.Context, s *suite, res *result) error         { return errTodo }
func scenarioSoak(ctx context.Context, s *suite, res *result) error             { return errTodo }
