// Package docs holds tests that keep the documentation true to the code: the README's flag tables
// are compared with the flags each program prints for -h.
package docs
