package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// DevInfoFile is the file, in its data dir, where a running `ledger dev` says where
// it serves. Other commands given --data-dir read it to find NATS and PostgreSQL.
const DevInfoFile = "dev.json"

// DefaultDataDir is the default --data-dir of `ledger dev` and its companions.
const DefaultDataDir = "./.ledger"

// DevInfo is the content of dev.json. URLs are stored as they are (the data dir is
// private to its user: the file is written 0600); print them through Redact.
type DevInfo struct {
	PID           int       `json:"pid"`
	NATSURL       string    `json:"nats_url"`
	DatabaseURL   string    `json:"database_url"`
	EventStoreURL string    `json:"eventstore_url"`
	HTTPURL       string    `json:"http_url"`
	StartedAt     time.Time `json:"started_at"`
}

// WriteDevInfo writes dir/dev.json atomically (a temp file renamed over it).
func WriteDevInfo(dir string, info DevInfo) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, DevInfoFile+".*")
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("config: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, DevInfoFile)); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// ErrNoDevInfo means the data dir has no dev.json: no `ledger dev` ran there.
var ErrNoDevInfo = errors.New("config: no dev.json in the data dir (is `ledger dev` running there?)")

// ReadDevInfo reads dir/dev.json. Running reports whether the process that wrote it
// is still alive (a file left by a killed `ledger dev` is stale).
func ReadDevInfo(dir string) (info DevInfo, running bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, DevInfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return DevInfo{}, false, fmt.Errorf("%w: %s", ErrNoDevInfo, dir)
	}
	if err != nil {
		return DevInfo{}, false, fmt.Errorf("config: %w", err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return DevInfo{}, false, fmt.Errorf("config: %s: %w", filepath.Join(dir, DevInfoFile), err)
	}
	return info, processAlive(info.PID), nil
}

// RemoveDevInfo removes dir/dev.json if it was written by pid.
func RemoveDevInfo(dir string, pid int) error {
	info, _, err := ReadDevInfo(dir)
	if err != nil || info.PID != pid {
		return nil
	}
	if err := os.Remove(filepath.Join(dir, DevInfoFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
