"""`manage.py ensure_operator --username U --password P [--email E]`: create or update an operator superuser."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_email
from django.db import transaction
from django_tenants.utils import get_public_schema_name, schema_context


class Command(BaseCommand):
    help = (
        "Create or update a platform operator (a superuser in the public schema) who signs in to the operator "
        "console at /admin/ on the public host. Idempotent: running it again resets the password and flags."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True, help="operator's login name")
        parser.add_argument("--password", required=True, help="operator's password (checked by the validators)")
        parser.add_argument("--email", help="operator's e-mail address (kept unchanged when omitted)")

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = (options["username"] or "").strip()
        password = options["password"] or ""
        email = options["email"]
        self._validate(User, username, password, email)

        # Operators live in the public schema; tenant schemas hold only each tenant's own API users.
        with schema_context(get_public_schema_name()), transaction.atomic():
            user = User.objects.select_for_update().filter(**{User.USERNAME_FIELD: username}).first()
            created = user is None
            if user is None:
                user = User(**{User.USERNAME_FIELD: username})
            if email is not None:
                user.email = email.strip()
            user.is_staff = True
            user.is_superuser = True
            user.is_active = True
            user.set_password(password)
            user.save()
        self.stdout.write(f"{'created' if created else 'updated'} operator {username}")

    def _validate(self, User, username: str, password: str, email: str | None) -> None:
        if not username:
            raise CommandError("--username must not be empty.")
        try:
            User._meta.get_field(User.USERNAME_FIELD).run_validators(username)
        except ValidationError as exc:
            raise CommandError(f"Invalid --username {username!r}: {' '.join(exc.messages)}") from None
        if not password:
            raise CommandError("--password must not be empty.")
        try:
            validate_password(password, User(**{User.USERNAME_FIELD: username}))
        except ValidationError as exc:
            raise CommandError(f"Password refused: {' '.join(exc.messages)}") from None
        if email is not None and email.strip():
            try:
                validate_email(email.strip())
            except ValidationError:
                raise CommandError(f"Invalid --email {email!r}.") from None
