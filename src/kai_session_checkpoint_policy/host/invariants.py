"""The invariants registry: one active registration per package name, held by an owner."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["InvariantRegistrationError", "InvariantRegistry", "Registration"]


class InvariantRegistrationError(ValueError):
    """A package name was registered twice, or is not a usable name."""


class Registration:
    """An active claim on a package name; :meth:`release` gives the name back."""

    __slots__ = ("_registry", "owner", "package")

    def __init__(self, registry: InvariantRegistry, package: str, owner: object) -> None:
        self._registry: InvariantRegistry | None = registry
        self.package = package
        self.owner = owner

    @property
    def active(self) -> bool:
        return self._registry is not None

    def release(self) -> None:
        """Release the name; releasing twice does nothing."""
        registry, self._registry = self._registry, None
        if registry is not None:
            del registry._active[self.package]


class InvariantRegistry:
    """Package-owned invariant checks, keyed by package name."""

    def __init__(self) -> None:
        self._active: dict[str, Registration] = {}

    def register(
        self, package: str, *, owner: object = None, install: Callable[[], None] | None = None
    ) -> Registration:
        """Claim *package* for *owner* and run its installer.

        :raises InvariantRegistrationError: if the name is empty, contains white space, or is
            already registered. If the installer raises, the name is released again and the
            error propagates.
        """
        if not package or any(character.isspace() for character in package):
            raise InvariantRegistrationError(
                f"invariants: package name {package!r} must be non-empty without white space"
            )
        if package in self._active:
            raise InvariantRegistrationError(
                f'invariants: package "{package}" is already registered'
            )
        registration = self._active[package] = Registration(self, package, owner)
        if install is not None:
            try:
                install()
            except BaseException:
                registration.release()
                raise
        return registration

    def release(self, package: str, *, owner: object = None) -> bool:
        """Release *package* if *owner* holds it; return whether it did."""
        registration = self._active.get(package)
        if registration is None or registration.owner is not owner:
            return False
        registration.release()
        return True

    def registered(self) -> tuple[str, ...]:
        """The names with an active registration, in registration order."""
        return tuple(self._active)
