# throttler: build the same binary README builds, run it from a distroless
# image as a non-root user.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/throttler ./cmd/throttler && \
    CGO_ENABLED=0 go build -trimpath -o /out/fakegateway ./cmd/fakegateway

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/throttler /out/fakegateway /usr/local/bin/
USER nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/throttler"]
CMD ["serve", "--config", "/etc/throttler/config.toml"]
