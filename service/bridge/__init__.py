"""Bridges between stratameter's topics and the tools reviewers work in.

``stratameter bridge label-studio`` (`bridge`): label requests become Label Studio tasks, reviewers'
annotations come back as labels (docs/how-to/label-studio.md).  Modules: `bridge` (the
process: start, loops, readiness probes, `run`), `startup` (its start-up checks), `context` (the
clients and helpers its parts share), `intake` (label requests in, one task each), `claims` (the
claim protocol behind "one task per request": a typed state, stored as text in Redis), `answers`
(webhook workers forwarding the first annotation), `polling` (what webhooks missed, and expiry),
`gauges` (read at scrape time), `client` (Label Studio's REST API), `mapping` (tasks, labelling
config, annotations and webhook bodies: pure functions), `http` (webhook, metrics, probes),
`metrics`, `command` (the CLI).  A throw-away local Label Studio for the demo and the tests:
`stratameter.demo.label_studio`.
"""
