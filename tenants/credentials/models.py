"""API tokens of one tenant (its schema). The key itself is never stored: only its SHA-256 digest, which is enough
for a key of 256 random bits (no dictionary to try), and a short prefix that lets people tell tokens apart."""

from __future__ import annotations

from django.db import models


class TokenScope(models.TextChoices):
    READ = "read", "read (GET and previews)"
    WRITE = "write", "write (every call)"


class ApiToken(models.Model):
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ci-deploy'; named in versions.")
    scope = models.CharField(max_length=5, choices=TokenScope.choices)
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex.")
    prefix = models.CharField(max_length=12, help_text="The key's first characters, to recognise it by.")
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=200, help_text="Who issued it, e.g. 'operator:alice'.")
    expires_at = models.DateTimeField(help_text="From this instant the key answers 401.")
    last_used_at = models.DateTimeField(null=True, blank=True, help_text="Recorded at most once a minute.")

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.scope}, {self.prefix}…)"
