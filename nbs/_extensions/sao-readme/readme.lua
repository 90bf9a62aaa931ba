-- README.md as `sao-repro docs --readme` writes it, whenever Quarto renders nbs/index.ipynb to markdown.
--
-- nbdev-readme renders the readme notebook with `quarto render ... -t gfm`. Before that, nbdev's processing of the
-- notebook ran sao_repro.report.readme.ReadmeText, which wrote README.md's text into nbdev's cache as .sao_readme.md.
-- This filter replaces the document with that text as one raw markdown block, which pandoc's markdown writers pass
-- through unchanged: nbdev's README and `sao-repro docs --readme`'s are the same bytes. Other formats (the HTML
-- docs) are left alone.
local SIDE = ".sao_readme.md"

local function candidate_dirs()
  local dirs = {}
  if quarto and quarto.project and type(quarto.project.directory) == "string" then
    table.insert(dirs, quarto.project.directory)
  end
  local env = os.getenv("QUARTO_PROJECT_DIR")
  if env then table.insert(dirs, env) end
  if quarto and quarto.doc and type(quarto.doc.input_file) == "string" then
    table.insert(dirs, pandoc.path.directory(quarto.doc.input_file))
  end
  for _, f in ipairs(PANDOC_STATE.input_files or {}) do
    table.insert(dirs, pandoc.path.directory(f))
  end
  table.insert(dirs, ".")
  return dirs
end

local function readme_text()
  for _, d in ipairs(candidate_dirs()) do
    local f = io.open(pandoc.path.join({d, SIDE}), "r")
    if f then
      local text = f:read("a")
      f:close()
      return text
    end
  end
  return nil
end

function Pandoc(doc)
  if not (FORMAT:match("gfm") or FORMAT:match("markdown") or FORMAT:match("commonmark")) then
    return nil
  end
  local text = readme_text()
  if not text then
    io.stderr:write("sao-readme: no " .. SIDE .. " next to the notebook (nbdev writes it); this is Quarto's own "
      .. "rendering, not README.md as `sao-repro docs --readme` writes it\n")
    return nil
  end
  return pandoc.Pandoc({pandoc.RawBlock("markdown", text)}, pandoc.Meta({}))
end
