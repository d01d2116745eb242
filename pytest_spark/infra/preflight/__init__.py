"""Preflight of the hosts: containers, image, driver, disk, model directory, clock, SSH
(``parse``, ``probe``, ``gather``, ``check``)."""
