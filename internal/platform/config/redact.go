package config

import (
	"net/url"
	"regexp"
	"strings"
)

// redacted replaces a secret in a rendered URL or DSN.
const redacted = "xxxxx"

// secretParams are query parameters and DSN keys whose values are secrets.
var secretParams = []string{"password", "pass", "passwd", "token", "secret", "sslpassword", "nkey", "jwt"}

// dsnSecret matches key=value secrets of a keyword/value connection string
// ("host=h password=p"), quoted or not.
var dsnSecret = regexp.MustCompile(`(?i)\b(` + strings.Join(secretParams, "|") + `)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]*)`)

// Redact returns s with its secrets replaced, for logs and printed output: the
// password of a URL's user info (and, for NATS URLs, a lone user name, which is how
// a token is passed), secret query parameters, and password=... in a keyword/value
// DSN. Several URLs separated by commas (a NATS server list) are each redacted.
// A string that parses as none of these is returned with DSN secrets removed.
func Redact(s string) string {
	if s == "" {
		return s
	}
	if strings.Contains(s, "://") && strings.Contains(s, ",") && !strings.Contains(s, " ") {
		parts := strings.Split(s, ",")
		if len(parts) > 1 && strings.Contains(parts[1], "://") {
			for i, p := range parts {
				parts[i] = Redact(p)
			}
			return strings.Join(parts, ",")
		}
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || !strings.Contains(s, "://") {
		return dsnSecret.ReplaceAllString(s, "${1}="+redacted)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		} else if isNATS(u.Scheme) && u.User.Username() != "" {
			u.User = url.User(redacted) // nats://TOKEN@host
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		changed := false
		for k := range q {
			for _, secret := range secretParams {
				if strings.EqualFold(k, secret) {
					q.Set(k, redacted)
					changed = true
				}
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

func isNATS(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "nats", "tls", "ws", "wss":
		return true
	}
	return false
}
