"""Tests of the native torch backend."""
