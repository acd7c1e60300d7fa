"""Bridges between stratameter's topics and the tools reviewers work in.

``stratameter bridge label-studio`` (`bridge`): label requests become Label Studio tasks, reviewers'
annotations come back as labels (README "Reviewing in Label Studio").  Modules: `bridge` (the
process: requests in, answers out, polling and expiry), `client` (Label Studio's REST API),
`mapping` (tasks, labelling config, annotations and webhook bodies: pure functions), `http`
(webhook, metrics, probes), `metrics`, `command` (the CLI).  A throw-away local Label Studio for the
demo and the tests: `stratameter.demo.label_studio`.
"""
