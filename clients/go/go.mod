module github.com/haunt-chaos/haunt/clients/go

go 1.22
