# One image for every aurora service (aurora <subcommand>) and auroractl.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -o /out/aurora ./cmd/aurora && \
    CGO_ENABLED=0 go build -trimpath -o /out/auroractl ./cmd/auroractl && \
    CGO_ENABLED=0 go build -trimpath -o /out/aurora-example-ledger ./examples/ledger

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/aurora /out/auroractl /out/aurora-example-ledger /usr/local/bin/
USER nonroot
ENTRYPOINT ["/usr/local/bin/aurora"]
