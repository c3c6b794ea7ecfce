package main

import (
	"context"
	"errors"
)

var errTodo = errors.New("not implemented yet")

func scenarioPartitions(ctx context.Context, s *suite, res *result) error  { return errTodo }
func scenarioCommitOrder(ctx context.Context, s *suite, res *result) error { return errTodo }
func scenarioBadInput(ctx context.Context, s *suite, res *result) error    { return errTodo }
