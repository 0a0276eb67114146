"""An import-linter contract: every package is entered through its face.

A package's face is its `__init__.py`, which exports the package's public names. Code outside a
package imports the face, never a file inside it: an import may reach at most one step below the
deepest package that holds both the importer and the imported module. So `api/launch.py` may
import `tokenrouter.engine` but not `tokenrouter.engine.model_core`, `engine/model_core.py` may
import `tokenrouter.engine.kv` but not `tokenrouter.engine.kv.cache`, and inside a package its
files and its face import each other freely, but no module imports the face of a package that
holds it (the face imports its files: that would be a circle). import-linter counts imports made only for type
checking and inside functions too. pyproject.toml names this contract type (`contract_types`).
"""

from __future__ import annotations

from importlinter import Contract, ContractCheck, fields, output


def crossing(importer: str, imported: str) -> bool:
    """Whether `importer` reaches past the face of a package that does not hold it, or imports
    the face of one that does."""
    a, b = importer.split("."), imported.split(".")
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    return len(b) > common + 1 or common == len(b) < len(a)


class FacesContract(Contract):
    """Imports into each package under `containers` go through that package's face."""

    type_name = "faces"
    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        links = []
        for container in self.containers:  # type: ignore[attr-defined]
            inside = {container, *graph.find_descendants(container)}
            for importer in sorted(inside):
                for imported in sorted(graph.find_modules_directly_imported_by(importer) & inside):
                    if crossing(importer, imported):
                        details = graph.get_import_details(importer=importer, imported=imported)
                        links.append((importer, imported, [d["line_number"] for d in details]))
        return ContractCheck(kept=not links, metadata={"links": links})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("import a package's face, never a file inside it; and never the face of your own package:")
        for importer, imported, lines in check.metadata["links"]:
            output.print_error(f"- {importer} -> {imported} ({', '.join(f'l.{n}' for n in lines)})")
        output.new_line()
