"""Tests of tailcut.reports."""
