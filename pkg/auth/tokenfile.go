package auth

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// maxFileBytes bounds the token file read (a misconfigured path such as
// /dev/zero must not eat memory).
const maxFileBytes = 64 << 10

// readTokenFile reads the tokens of a token file: one per line, the first
// signs; blank lines and lines starting with '#' are skipped; each line is
// trimmed of surrounding whitespace. It refuses a file that is not a
// regular file, is writable by every user, is larger than 64 KiB, or holds
// no token, a token shorter than MinTokenLen or more than MaxTokens; it
// warns about a file readable by every user. Errors name the file and the
// line, never the token.
func readTokenFile(path string) (tokens [][]byte, warnings []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrTokenFile, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrTokenFile, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%w: %s is not a regular file", ErrTokenFile, path)
	}
	perm := fi.Mode().Perm()
	if perm&0o002 != 0 {
		return nil, nil, fmt.Errorf("%w: %s is writable by every user (mode %04o): chmod o-w it", ErrTokenFile, path, perm)
	}
	if perm&0o004 != 0 {
		warnings = append(warnings, fmt.Sprintf("%s is readable by every user (mode %04o): chmod 0600 or 0640 it", path, perm))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrTokenFile, path, err)
	}
	if len(b) > maxFileBytes {
		return nil, nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrTokenFile, path, maxFileBytes)
	}
	for i, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if len(line) < MinTokenLen {
			return nil, nil, fmt.Errorf("%w: the token on line %d of %s is %d bytes, need at least %d (for example: head -c 32 /dev/urandom | base64)",
				ErrTokenFile, i+1, path, len(line), MinTokenLen)
		}
		if !containsToken(tokens, line) {
			tokens = append(tokens, bytes.Clone(line))
		}
	}
	if len(tokens) == 0 {
		return nil, nil, fmt.Errorf("%w: %s holds no token", ErrTokenFile, path)
	}
	if len(tokens) > MaxTokens {
		return nil, nil, fmt.Errorf("%w: %s holds %d tokens, at most %d", ErrTokenFile, path, len(tokens), MaxTokens)
	}
	return tokens, warnings, nil
}

// checkTokens applies the file rules to tokens given directly.
func checkTokens(tokens [][]byte) error {
	if len(tokens) == 0 {
		return fmt.Errorf("%w: no token", ErrTokenFile)
	}
	if len(tokens) > MaxTokens {
		return fmt.Errorf("%w: %d tokens, at most %d", ErrTokenFile, len(tokens), MaxTokens)
	}
	for i, t := range tokens {
		if len(t) < MinTokenLen {
			return fmt.Errorf("%w: token %d is %d bytes, need at least %d", ErrTokenFile, i+1, len(t), MinTokenLen)
		}
		if containsToken(tokens[:i], t) {
			return fmt.Errorf("%w: token %d is given twice", ErrTokenFile, i+1)
		}
	}
	return nil
}

func containsToken(tokens [][]byte, t []byte) bool {
	for _, x := range tokens {
		if bytes.Equal(x, t) {
			return true
		}
	}
	return false
}
