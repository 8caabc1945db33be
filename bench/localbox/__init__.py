"""The embedded endpoint. Its modules import the envd stubs of the `e2b` package, not the SDK's client (`stubs`)."""

from .stubs import defer_sdk_init

defer_sdk_init()
